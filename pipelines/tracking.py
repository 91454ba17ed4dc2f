"""MLflow: every learner step, gate decision and deploy is a run people can review.

The embedded default is a real MLflow store (SQLite + a local artifact folder), used
directly by the library; `tracerl start mlflow` serves the same store in the UI.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any, Iterator

from pipelines.config import TracerlConfig
from pipelines.durable import file_lock

TRACKING_ENV = "MLFLOW_TRACKING_URI"
# tracerl's runs are model training (learner, gate, canary), not GenAI traces: production turns live
# in the lake. MLflow 3's UI opens an experiment on its GenAI overview ("Traces 0") unless told: the
# tag says the kind (`mlflow.experimentKind`, one of the UI's ExperimentKind values; releases that
# read it go by it), and MLflow 3.17's UI, which follows a global GenAI / Model training switch
# (browser local storage) unless the URL names one, opens on the runs from `runs_url` and keeps run
# pages in the Model training view from `run_path` (`?workflowType=machine_learning`; the UI carries
# the parameter on to the pages it links).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
MODEL_TRAINING = "workflowType=machine_learning"
SUPPRESS_URL = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"  # mlflow.environment_variables


def runs_url(cfg: TracerlConfig, ui: str) -> str:
    """The experiment's runs table in the MLflow UI at ``ui`` (what tracerl prints and links)."""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id(cfg)}?{MODEL_TRAINING}"


def run_path(experiment: str, run_id: str, artifact: str | None = None) -> str:
    """A run's page (or one of its artifacts) as the UI's hash route, relative to the UI: what a
    Markdown link in a description uses as is, and a full link prefixes with the UI's URL."""
    tail = f"/artifacts/{artifact}" if artifact else ""
    return f"#/experiments/{experiment}/runs/{run_id}{tail}?{MODEL_TRAINING}"


def use_store(uri: str) -> None:
    """Point MLflow's fluent API (mlflow.start_run, log_*) at ``uri`` without exporting it.

    MLflow 3's ``set_tracking_uri`` also sets MLFLOW_TRACKING_URI in os.environ, which
    ``load_config`` reads as an override of tracerl.toml: a process that later loads another
    config (a CLI call in a test, a Dagster run after a first one) would silently keep the first
    store. MLflow keeps the URI in its own global too, so the env var is put back as it was."""
    import mlflow

    before = os.environ.get(TRACKING_ENV)
    mlflow.set_tracking_uri(uri)
    if before is None:
        os.environ.pop(TRACKING_ENV, None)
    else:
        os.environ[TRACKING_ENV] = before


_created: set[str] = set()


def client(cfg: TracerlConfig):
    from mlflow import MlflowClient

    use_store(cfg.tracking_uri)
    if cfg.mlflow.tracking_uri is None and cfg.tracking_uri not in _created:
        create_store(cfg)
    return MlflowClient(cfg.tracking_uri)


def create_store(cfg: TracerlConfig) -> None:
    """Build the embedded SQLite store's schema once, one process at a time.

    MLflow creates a new store's tables on first connect, one migration after another; a second
    process connecting meanwhile (a Dagster sensor beside a CLI, the MLflow server beside a learner)
    reads a half-migrated schema and fails with "out-of-date database schema". The first connect of
    each process on a home holds ``<home>/mlflow.db.lock``; later connects only read the schema."""
    from mlflow import MlflowClient

    cfg.home.mkdir(parents=True, exist_ok=True)
    with file_lock(cfg.home / "mlflow.db.lock"):
        c = MlflowClient(cfg.tracking_uri)
        c.search_experiments(max_results=1)       # the tracking store's tables
        c.search_registered_models(max_results=1)  # the model registry's
    _created.add(cfg.tracking_uri)


def experiment_id(cfg: TracerlConfig, name: str | None = None) -> str:
    """The experiment, created with its artifacts under the tracerl home (not ./mlruns)."""
    c = client(cfg)
    name = name or cfg.mlflow.experiment
    exp = c.get_experiment_by_name(name)
    if exp:
        if EXPERIMENT_KIND[0] not in exp.tags:  # an experiment made before the tag was set
            c.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
        return exp.experiment_id
    location = None
    if cfg.mlflow.tracking_uri is None:
        cfg.artifact_root.mkdir(parents=True, exist_ok=True)
        location = (cfg.artifact_root / name).as_uri()
    from mlflow.exceptions import MlflowException

    try:
        return c.create_experiment(name, artifact_location=location, tags=dict([EXPERIMENT_KIND]))
    except MlflowException:  # learners of two targets, each in its own run, both came to create it
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


@contextmanager
def run(cfg: TracerlConfig, name: str, tags: dict[str, str], params: dict[str, Any],
        experiment: str | None = None, started: float | None = None) -> Iterator[Any]:
    """An MLflow run with its resolved config as params (flattened, dotted keys).

    ``started`` (``time.time()`` when the work began) backdates the run's start, so a run opened
    only once there is something to log (after a learner step, a gate's sampling) still shows how
    long the work took; it ends when the block does."""
    import mlflow

    c = client(cfg)
    tags = {k: str(v) for k, v in tags.items()}  # a REST store (an MLflow server) takes strings only
    exp = experiment_id(cfg, experiment)
    run_id = None
    if started is not None:
        run_id = c.create_run(exp, start_time=int(min(started, time.time()) * 1000), tags=tags,
                              run_name=name).info.run_id
    # an MLflow server's client prints "View experiment at: <bare experiment link>" as a run ends,
    # which opens the GenAI overview: printed here instead, with links to the runs (`run_path`)
    quiet = os.environ.get(SUPPRESS_URL)
    os.environ[SUPPRESS_URL] = "true"
    try:
        with mlflow.start_run(run_id=run_id, experiment_id=exp, run_name=None if run_id else name,
                              tags=None if run_id else tags) as r:
            flat = flatten(params)
            for i in range(0, len(flat), 100):  # MLflow caps a batch at 100 params
                mlflow.log_params(dict(list(flat.items())[i:i + 100]))
            yield r
    finally:
        if quiet is None:
            os.environ.pop(SUPPRESS_URL, None)
        else:
            os.environ[SUPPRESS_URL] = quiet
    ui = cfg.mlflow.tracking_uri or ""
    if ui.startswith(("http://", "https://")) and quiet is None:
        ui = ui.rstrip("/")
        print(f"MLflow run {r.info.run_name or name}: {ui}/{run_path(exp, r.info.run_id)} "
              f"(the experiment's runs: {ui}/#/experiments/{exp}?{MODEL_TRAINING})", flush=True)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out
