"""The embedded MLflow tracking server: the UI over tracerl's SQLite store.

It serves the same store and artifact folder that the pipelines write through
`cfg.tracking_uri` (SQLite, `<home>/mlflow.db`), so people review runs and the model
registry at http://127.0.0.1:5000 while the loop keeps writing. With
`mlflow.tracking_uri` set to your own server there is nothing to start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipelines import tracking
from pipelines.config import TracerlConfig
from pipelines.services import process

NAME = "mlflow"
DEFAULT_PORT = 5000


def embedded(cfg: TracerlConfig) -> bool:
    return cfg.mlflow.tracking_uri is None


def start_mlflow(cfg: TracerlConfig, port: int | None = None, timeout: float = 120.0) -> process.ProcessState:
    state = process.read_state(cfg.run_dir, NAME)
    if state:
        return state
    mlflow = Path(sys.executable).parent / "mlflow"
    port = port or process.free_port(DEFAULT_PORT)
    cfg.artifact_root.mkdir(parents=True, exist_ok=True)
    if embedded(cfg):
        tracking.create_store(cfg)  # the server finds a complete schema, never builds it beside a learner
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    state = process.spawn(
        NAME, [str(mlflow), "server", "--backend-store-uri", cfg.tracking_uri,
               "--default-artifact-root", cfg.artifact_root.as_uri(), "--host", "127.0.0.1",
               "--port", str(port), "--workers", "1"],
        run_dir=cfg.run_dir, log=cfg.log_dir / "mlflow.log", port=port, url=f"http://127.0.0.1:{port}", env=env)
    process.wait_http(state, "/health", timeout, cfg.run_dir)
    return state


def stop_mlflow(cfg: TracerlConfig) -> bool:
    return process.stop(cfg.run_dir, NAME)


def read_state(cfg: TracerlConfig) -> process.ProcessState | None:
    return process.read_state(cfg.run_dir, NAME)
