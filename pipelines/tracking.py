"""MLflow: every learner step, gate decision and deploy is a run people can review.

The embedded default is a real MLflow store (SQLite + a local artifact folder), used
directly by the library; `tracerl start mlflow` serves the same store in the UI.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

from pipelines.config import TracerlConfig

TRACKING_ENV = "MLFLOW_TRACKING_URI"


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


def client(cfg: TracerlConfig):
    from mlflow import MlflowClient

    use_store(cfg.tracking_uri)
    return MlflowClient(cfg.tracking_uri)


def experiment_id(cfg: TracerlConfig, name: str | None = None) -> str:
    """The experiment, created with its artifacts under the tracerl home (not ./mlruns)."""
    c = client(cfg)
    name = name or cfg.mlflow.experiment
    exp = c.get_experiment_by_name(name)
    if exp:
        return exp.experiment_id
    location = None
    if cfg.mlflow.tracking_uri is None:
        cfg.artifact_root.mkdir(parents=True, exist_ok=True)
        location = (cfg.artifact_root / name).as_uri()
    return c.create_experiment(name, artifact_location=location)


@contextmanager
def run(cfg: TracerlConfig, name: str, tags: dict[str, str], params: dict[str, Any],
        experiment: str | None = None) -> Iterator[Any]:
    """An MLflow run with its resolved config as params (flattened, dotted keys)."""
    import mlflow

    client(cfg)
    tags = {k: str(v) for k, v in tags.items()}  # a REST store (an MLflow server) takes strings only
    with mlflow.start_run(experiment_id=experiment_id(cfg, experiment), run_name=name, tags=tags) as r:
        flat = flatten(params)
        for i in range(0, len(flat), 100):  # MLflow caps a batch at 100 params
            mlflow.log_params(dict(list(flat.items())[i:i + 100]))
        yield r


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out
