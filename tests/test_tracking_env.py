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
