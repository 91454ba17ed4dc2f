"""Links from Dagster metadata into the MLflow UI: the run that trained or gated a candidate,
and the model version it became, one click from the asset's materialization. Experiment and run
links open in the UI's Model training view (pipelines/tracking.py: `runs_url`, `run_path`)."""

from __future__ import annotations

import dagster as dg

from pipelines.config import TracerlConfig

DEFAULT_UI = "http://127.0.0.1:5000"  # what `tracerl up` starts for the embedded store


def mlflow_ui(cfg: TracerlConfig) -> str:
    """The MLflow UI for cfg's store: the tracking server itself when it is one (http[s]), else the
    embedded server `tracerl up` runs (its recorded URL when running, its default port when not)."""
    uri = cfg.mlflow.tracking_uri or ""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    from pipelines.services.mlflow_server import read_state

    state = read_state(cfg)
    return state.url if state else DEFAULT_UI


def model_version_url(cfg: TracerlConfig, tenant: str, task: str, version: str | int) -> dg.MetadataValue:
    from pipelines.adapters.registry import model_name

    return dg.MetadataValue.url(f"{mlflow_ui(cfg)}/#/models/{model_name(tenant, task)}/versions/{version}")


def run_url(cfg: TracerlConfig, run_id: str) -> dg.MetadataValue:
    """An MLflow run's page, by id, in the UI's Model training view (`tracking.run_path`)."""
    from pipelines.tracking import client, run_path

    try:
        experiment = client(cfg).get_run(run_id).info.experiment_id
    except Exception:  # noqa: BLE001 - a link is a convenience; the id is in the link too
        experiment = "0"
    return dg.MetadataValue.url(f"{mlflow_ui(cfg)}/{run_path(experiment, run_id)}")
