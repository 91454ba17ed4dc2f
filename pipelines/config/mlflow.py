"""``[mlflow]``: where runs, metrics, adapters and the model registry live."""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION


@dataclass(config=SECTION)
class MlflowConfig:
    """Where runs, metrics, adapters and the model registry live.

    `tracking_uri=None` is the embedded default: a SQLite store at `<home>/mlflow.db` with
    artifacts under `<home>/mlartifacts` (what `tracerl start mlflow` serves in the UI).
    Set it to `http://your-mlflow:5000` (or a Postgres URI) to use your own.
    """

    tracking_uri: str | None = None
    experiment: str = "tracerl"
