"""The local stack, one service at a time or all together (`tracerl up` / `down` / `status`).

Start order: Kafka, MLflow, vLLM, gateway, Dagster; stop goes in reverse, so the gateway hands its
queue to Kafka (or its spill) before the broker stops, and comes back after it (its journal then
re-sends what the in-memory broker lost, see `deploy/journal.py`). Each service
records its PID and port under `<home>/run/`, so `down` stops only what tracerl started,
and a service pointed elsewhere by the config (your Kafka cluster, your MLflow server) is
reported as external and never started or stopped.
"""

from __future__ import annotations

import os

from pipelines.config import TracerlConfig

SERVICES = ("kafka", "mlflow", "vllm", "gateway", "dagster")
SERVE = ("kafka", "vllm", "gateway")  # what `tracerl serve` runs


def start(cfg: TracerlConfig, name: str) -> str:
    """Start `name` (or find it running); one line saying where it listens."""
    if name == "kafka":
        from pipelines.services.kafka import start_broker

        if not cfg.kafka.embedded:
            return f"external cluster {cfg.kafka.bootstrap_servers}; nothing to start"
        s = start_broker(cfg)
        return f"embedded Tansu on {s.bootstrap} (pid {s.pid}, log {s.log})"
    if name == "mlflow":
        from pipelines.services.mlflow_server import embedded, start_mlflow

        if not embedded(cfg):
            return f"external {cfg.mlflow.tracking_uri}; nothing to start"
        from pipelines.tracking import runs_url

        m = start_mlflow(cfg)
        return f"{m.url} (UI; runs: {runs_url(cfg, m.url)}; store {cfg.tracking_uri}, pid {m.pid}, log {m.log})"
    if name == "vllm":
        from pipelines.deploy.vllm_server import start_vllm
        from pipelines.models.registry import resolve_base_model

        base = resolve_base_model(cfg.train.base_model, cfg.home)
        v = start_vllm(base, home=cfg.home, config=cfg.serve)
        return f"{v.base_url} serving {v.base_model} as '{v.served_model_name}' (pid {v.pid}, log {v.log})"
    if name == "gateway":
        from pipelines.deploy.service import start_gateway

        g = start_gateway(cfg, config_path=os.environ.get("TRACERL_CONFIG"))
        return f"{g.url} (pid {g.pid}); admin key in {cfg.home / 'gateway' / 'admin.key'} unless configured"
    if name == "dagster":
        from pipelines.reward.spec import fallback_spec_path
        from pipelines.services.dagster import dagster_home, start_dagster

        d = start_dagster(cfg, reward_spec=fallback_spec_path())
        return f"{d.url} (webserver + daemon, DAGSTER_HOME={dagster_home()}, pid {d.pid}, log {d.log})"
    raise ValueError(f"unknown service {name!r}; one of {SERVICES}")


def stop(cfg: TracerlConfig, name: str) -> bool:
    """Stop `name` if tracerl started it; False if it was not running."""
    if name == "kafka":
        from pipelines.services.kafka import stop_broker

        return stop_broker(cfg)
    if name == "mlflow":
        from pipelines.services.mlflow_server import stop_mlflow

        return stop_mlflow(cfg)
    if name == "vllm":
        from pipelines.deploy.vllm_server import stop_vllm

        return stop_vllm(cfg.home)
    if name == "gateway":
        from pipelines.deploy.service import stop_gateway

        return stop_gateway(cfg)
    if name == "dagster":
        from pipelines.services.dagster import stop_dagster

        return stop_dagster(cfg)
    raise ValueError(f"unknown service {name!r}; one of {SERVICES}")


def status(cfg: TracerlConfig, name: str) -> str:
    if name == "kafka":
        from pipelines.services.kafka import read_state

        if not cfg.kafka.embedded:
            return f"external {cfg.kafka.bootstrap_servers}"
        s = read_state(cfg)
        return f"running on {s.bootstrap} (pid {s.pid})" if s else "stopped"
    if name == "mlflow":
        from pipelines.services.mlflow_server import embedded, read_state as read_mlflow

        if not embedded(cfg):
            return f"external {cfg.mlflow.tracking_uri}"
        m = read_mlflow(cfg)
        return f"running on {m.url} (pid {m.pid})" if m else "stopped"
    if name == "vllm":
        from pipelines.deploy.vllm_server import read_state as read_vllm

        v = read_vllm(cfg.home)
        return f"running on {v.base_url} (pid {v.pid}, {v.base_model})" if v else "stopped"
    if name == "gateway":
        from pipelines.deploy.service import read_gateway_state

        g = read_gateway_state(cfg)
        return f"running on {g.url} (pid {g.pid})" if g else "stopped"
    if name == "dagster":
        from pipelines.services.dagster import read_state as read_dagster

        d = read_dagster(cfg)
        return f"running on {d.url} (pid {d.pid})" if d else "stopped"
    raise ValueError(f"unknown service {name!r}; one of {SERVICES}")
