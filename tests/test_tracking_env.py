"""Using one MLflow store must not change which store the next loaded config names.

MLflow 3's set_tracking_uri exports MLFLOW_TRACKING_URI, an override load_config honours: before
tracking.use_store, a process that had talked to store A kept writing to A after loading a config
naming store B (seen in CI: a CLI call in a test found an empty registry)."""

from __future__ import annotations

import os

from pipelines import tracking
from pipelines.config import load_config


def test_a_second_config_keeps_its_own_store_after_the_first_was_used(tmp_path, monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    for path, name in ((a, "a"), (b, "b")):
        path.write_text(f'home = "{tmp_path / name}"\n[mlflow]\ntracking_uri = "sqlite:///{tmp_path / name}.db"\n')
    tracking.client(load_config(a)).search_registered_models()
    assert tracking.TRACKING_ENV not in os.environ
    assert load_config(b).tracking_uri == f"sqlite:///{tmp_path / 'b'}.db"


def test_an_exported_store_stays_the_override_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv(tracking.TRACKING_ENV, f"sqlite:///{tmp_path / 'env'}.db")
    tracking.use_store(f"sqlite:///{tmp_path / 'other'}.db")
    assert os.environ[tracking.TRACKING_ENV] == f"sqlite:///{tmp_path / 'env'}.db"


def test_a_run_opened_after_the_work_is_dated_from_when_the_work_began(tmp_path, monkeypatch):
    """A learner or gate run opens only once there is something to log; ``started`` dates it from
    the work's start, so the UI's duration is the work's, and its name, tags and params are kept."""
    import time

    from pipelines.config import TracerlConfig

    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    cfg = TracerlConfig(home=tmp_path / "home")
    began = time.time() - 40.0  # the work took 40 s before the run was opened
    with tracking.run(cfg, "learner acme/concise v4", tags={"tenant": "acme"}, params={"train": {"lr": 1}},
                      started=began) as r:
        pass
    run = tracking.client(cfg).get_run(r.info.run_id)
    assert run.info.start_time == int(began * 1000) and run.info.end_time - run.info.start_time >= 40_000
    assert run.info.run_name == "learner acme/concise v4" and run.info.status == "FINISHED"
    assert run.data.tags["tenant"] == "acme" and run.data.params == {"train.lr": "1"}
    with tracking.run(cfg, "plain", tags={}, params={}) as r2:
        pass
    plain = tracking.client(cfg).get_run(r2.info.run_id)
    assert plain.info.end_time - plain.info.start_time < 40_000 and plain.info.run_name == "plain"
    # the experiment opens on its runs in MLflow 3's UI, not on the GenAI traces overview
    exp = tracking.client(cfg).get_experiment(run.info.experiment_id)
    assert exp.tags[tracking.EXPERIMENT_KIND[0]] == "custom_model_development"


def _open_store_at(home: str, at: float) -> str:
    """In a fresh process: wait until ``at``, then open the embedded store of ``home``; the error, if any."""
    import time

    from pipelines.config import TracerlConfig

    os.environ.pop(tracking.TRACKING_ENV, None)
    time.sleep(max(0.0, at - time.time()))
    try:
        tracking.client(TracerlConfig(home=home)).search_registered_models()
        return ""
    except Exception as e:  # noqa: BLE001 - the test reports what failed
        return f"{type(e).__name__}: {e}"[:300]


def test_processes_opening_a_new_store_at_once_all_find_it_whole(tmp_path):
    """MLflow builds a new SQLite store's schema on first connect, one migration at a time; a second
    process meanwhile read a half-built schema ("Detected out-of-date database schema", seen in CI: a
    test's learner run beside the Dagster daemon of `tracerl up` on a fresh home). Three processes
    open each of two fresh homes at the same instant: every one finds the whole schema."""
    import multiprocessing
    import time

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        for n in range(2):
            home = str(tmp_path / f"home{n}")
            at = time.time() + 8.0  # past the workers' interpreter start and imports
            errors = pool.starmap(_open_store_at, [(home, at)] * 3)
            assert errors == ["", "", ""], errors
