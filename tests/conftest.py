"""Shared fixtures: one real embedded Kafka broker for the whole session.

Each test gets its own topic, consumer group and lake, so tests never see
each other's messages, and nothing touches the developer's `.tracerl/`.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from pipelines.config import TracerlConfig
from pipelines.services.kafka import BrokerState, ensure_topic, start_broker, stop_broker


@pytest.fixture(scope="session")
def broker(tmp_path_factory) -> BrokerState:
    home = tmp_path_factory.mktemp("broker-home")
    cfg = TracerlConfig(home=home)
    state = start_broker(cfg, port=None)
    yield state
    stop_broker(cfg)


def write_stack_toml(folder: Path, bootstrap: str, name: str, extra: str = "") -> Path:
    """``folder/tracerl.toml`` for a test's own stack: home ``folder/home``, the session broker, a
    fresh topic and consumer group named ``<name>-<random>``, ``ingest.idle_seconds = 1``; ``extra``
    (more TOML tables: ``[train]``, ``[gateway]``, ...) is appended as it is.

    Use it where something reads the config from a file: a gateway process, the CLI's ``main``, a
    Dagster resource (then set ``TRACERL_CONFIG`` to it and unset ``MLFLOW_TRACKING_URI``, so the
    home's own MLflow store is used); ``make_config`` where an in-process config is enough."""
    toml = folder / "tracerl.toml"
    toml.write_text(f'''home = "{folder / 'home'}"
[kafka]
bootstrap_servers = "{bootstrap}"
topic = "{name}-{uuid.uuid4().hex[:8]}"
group_id = "{name}-{uuid.uuid4().hex[:8]}"
[ingest]
idle_seconds = 1.0
{extra.strip()}
''')
    return toml


def make_config(tmp: Path, bootstrap: str) -> TracerlConfig:
    cfg = TracerlConfig(home=tmp / "home")
    cfg.kafka.bootstrap_servers = bootstrap
    cfg.kafka.topic = f"t-{uuid.uuid4().hex[:10]}"
    cfg.kafka.group_id = f"g-{uuid.uuid4().hex[:10]}"
    cfg.ingest.idle_seconds = 1.0
    cfg.ingest.max_event_bytes = 64 * 1024
    return cfg


@pytest.fixture
def cfg(tmp_path, broker) -> TracerlConfig:
    """A config on the session broker with a fresh topic, group and lake."""
    c = make_config(tmp_path, broker.bootstrap)
    ensure_topic(c)
    return c
