"""tracerl's configuration: one typed place for every setting and path.

Defaults run everything embedded and local under `.tracerl/`. A user points a
stage at their own services by configuration only: a `tracerl.toml` file
(path in `TRACERL_CONFIG`, else `./tracerl.toml`) and a few env overrides:

    TRACERL_HOME                 state folder (default ./.tracerl)
    TRACERL_KAFKA_BOOTSTRAP      e.g. "broker1:9092,broker2:9092" (unset = embedded)
    TRACERL_LAKE                 lake root (default $TRACERL_HOME/lake)

Example `tracerl.toml`:

    [kafka]
    bootstrap_servers = "kafka-1:9093"
    security_protocol = "SASL_SSL"
    sasl_mechanism = "SCRAM-SHA-512"
    sasl_plain_username = "tracerl"
    sasl_plain_password = "..."
    ssl_cafile = "/etc/kafka/ca.pem"
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.deploy.gateway_config import GatewayConfig
from pipelines.deploy.vllm_server import ServeConfig
from pipelines.gate.config import GateConfig
from pipelines.train.config import TrainConfig

# kafka-python settings passed through unchanged when set (security and tuning).
KAFKA_PASSTHROUGH = (
    "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
    "sasl_kerberos_service_name", "ssl_cafile", "ssl_certfile", "ssl_keyfile",
    "ssl_password", "ssl_check_hostname", "client_id", "request_timeout_ms",
)


@dataclass
class KafkaConfig:
    """Where trace events flow. `bootstrap_servers=None` means the embedded Tansu broker."""

    bootstrap_servers: str | None = None
    topic: str = "tracerl.events"
    partitions: int = 4                  # used only when tracerl creates the topic
    replication_factor: int = 1          # likewise; use 3 on a real cluster
    group_id: str = "tracerl-ingest"
    embedded_port: int = 19092           # first port tried for the embedded broker
    session_timeout_ms: int = 6000       # group joins wait ~half of this on Tansu
    heartbeat_interval_ms: int = 2000
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    sasl_kerberos_service_name: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = None
    ssl_check_hostname: bool | None = None
    client_id: str | None = None
    request_timeout_ms: int | None = None

    @property
    def embedded(self) -> bool:
        return not self.bootstrap_servers

    def security_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in KAFKA_PASSTHROUGH if getattr(self, k) is not None}


@dataclass
class IngestConfig:
    """One ingest run = one bounded batch, so a Dagster run always finishes."""

    max_events: int = 200_000            # per run; the rest waits for the next run
    max_run_seconds: float = 600.0
    idle_seconds: float = 2.0            # stop once no message arrived for this long
    join_timeout_seconds: float = 30.0   # waiting for the group to assign partitions
    max_poll_records: int = 5000
    decode_workers: int = 2              # processes decoding JSON beside the poller; 0 = inline.
                                         # 2 measured best on 2 cores (bench/RESULTS.md)
    decode_parallel_from: int = 2000     # smaller polled chunks decode inline (a worker costs a spawn)
    max_event_bytes: int = 1 << 20       # larger messages are quarantined as oversize
    quarantine_rate_limit: float = 0.05  # asset check fails above this share
    # Direct Kafka producers: topic -> the one tenant allowed on it; an event on a mapped topic
    # claiming another tenant is quarantined (`tenant_mismatch`). Empty: trust the event's tenant.
    topic_tenants: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from pipelines.contract.validate import IDENT

        for topic, tenant in self.topic_tenants.items():
            if not isinstance(topic, str) or not isinstance(tenant, str) or not IDENT.fullmatch(tenant):
                raise ValueError(f"ingest.topic_tenants: {topic!r} = {tenant!r}: expected a topic name "
                                 f"mapped to a tenant id matching {IDENT.pattern}")


@dataclass
class MlflowConfig:
    """Where runs, metrics, adapters and the model registry live.

    `tracking_uri=None` is the embedded default: a SQLite store at `<home>/mlflow.db` with
    artifacts under `<home>/mlartifacts` (what `tracerl start mlflow` serves in the UI).
    Set it to `http://your-mlflow:5000` (or a Postgres URI) to use your own.
    """

    tracking_uri: str | None = None
    experiment: str = "tracerl"


@dataclass
class LearnerConfig:
    """When and on what the learner runs (the how is `TrainConfig`)."""

    min_new_turns: int = 32              # fewer new settled turns: skip, no empty run (replay never triggers one)
    max_turns: int = 256                 # new turns per iteration (oldest first)
    # Training branch (docs/learning.md): while the gate rejects candidates, the next one continues
    # from the last (adapter + AdamW state + reward baselines), not from the unchanged champion.
    branch: bool = True                  # False: every candidate starts from the champion (no memory)
    branch_max_kl: float = 0.3           # head's last-step KL to the base above this: reset to the
                                         # champion; the gate rejects above gate.max_kl=0.5, so reset first
    branch_max_depth: int = 8            # this many unpromoted candidates in a row: reset (a branch the
                                         # gate keeps rejecting is drifting, not converging)
    # Replay (docs/learning.md): settled turns of earlier iterations train again, rare outcomes first.
    replay_turns: int = 256              # replayed turns per iteration at most (0: no replay); = max_turns,
                                         # so a batch is at most half old data
    replay_max_uses: int = 4             # a turn trains at most this many times (1 = first use only): a
                                         # 2% positive gets 4 gradient contributions, not 1, without overfitting it
    replay_half_life: float = 2.0        # weight 0.5 ** (age / half_life), age in learner iterations since
                                         # first use: the policy moved on, old evidence counts less
    replay_min_weight: float = 0.1       # below this weight a turn leaves the pool (age > ~6.6 at half-life 2)

    def __post_init__(self) -> None:
        for name in ("min_new_turns", "max_turns", "branch_max_depth", "replay_max_uses"):
            if getattr(self, name) < 1:
                raise ValueError(f"learner.{name}={getattr(self, name)!r} must be >= 1")
        if self.replay_turns < 0:
            raise ValueError(f"learner.replay_turns={self.replay_turns!r} must be >= 0 (0 turns replay off)")
        if not self.branch_max_kl > 0:
            raise ValueError(f"learner.branch_max_kl={self.branch_max_kl!r} must be > 0 (KL is >= 0; "
                             f"use a large value to never reset on KL)")
        if not self.replay_half_life > 0:
            raise ValueError(f"learner.replay_half_life={self.replay_half_life!r} must be > 0 iterations")
        if not 0 < self.replay_min_weight <= 1:
            raise ValueError(f"learner.replay_min_weight={self.replay_min_weight!r} must be in (0, 1]")


@dataclass
class TracerlConfig:
    home: Path = Path(".tracerl")
    lake_root: Path | None = None
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    gate: GateConfig = field(default_factory=GateConfig)

    @property
    def lake(self) -> Path:
        return self.lake_root or self.home / "lake"

    @property
    def run_dir(self) -> Path:
        """PID and port files of embedded services."""
        return self.home / "run"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def adapter_root(self) -> Path:
        return self.home / "adapters"

    @property
    def tracking_uri(self) -> str:
        return self.mlflow.tracking_uri or f"sqlite:///{(self.home / 'mlflow.db').resolve()}"

    @property
    def artifact_root(self) -> Path:
        return (self.home / "mlartifacts").resolve()


def _fits(value: Any, tp: Any) -> bool:
    """Whether a TOML value fits a field's annotation (scalars, lists, tables, X | None)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if tp is Path:
        return isinstance(value, (str, Path))
    if origin in (list, tuple) or tp in (list, tuple):
        return isinstance(value, list)
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    return True  # Any, or a type TOML cannot spell: the section's own checks decide


def _apply(obj: Any, values: dict[str, Any], where: str) -> None:
    """Set ``values`` on the dataclass ``obj``: unknown names and wrong types are errors that
    name the setting; then the section's own checks (``__post_init__``) run again."""
    names = {f.name: f for f in dataclasses.fields(obj)}
    hints = typing.get_type_hints(type(obj))
    for key, value in values.items():
        if key not in names:
            raise ValueError(f"{where}: unknown setting {key!r}; known: {sorted(names)}")
        current = getattr(obj, key)
        if isinstance(current, TrainConfig):  # frozen, with a tagged union: its own parser
            setattr(obj, key, TrainConfig.from_dict({**current.to_dict(), **value}))
        elif dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(f"{where}.{key} must be a table, got {value!r}")
            _apply(current, value, f"{where}.{key}")
        elif not _fits(value, hints[key]):
            want = getattr(hints[key], "__name__", None) or str(hints[key])
            raise ValueError(f"{where}.{key} = {value!r}: expected {want}")
        elif isinstance(current, Path) or key in ("home", "lake_root"):
            setattr(obj, key, Path(value))
        else:
            setattr(obj, key, float(value) if hints[key] is float else value)
    post_init = getattr(obj, "__post_init__", None)
    if post_init is not None:
        post_init()


def load_config(path: str | Path | None = None, **overrides: Any) -> TracerlConfig:
    """Defaults, then the TOML file, then env vars, then keyword overrides."""
    cfg = TracerlConfig()
    path = Path(path or os.environ.get("TRACERL_CONFIG", "tracerl.toml"))
    if path.exists():
        _apply(cfg, tomllib.loads(path.read_text()), str(path))
    env = {
        "TRACERL_HOME": lambda v: setattr(cfg, "home", Path(v)),
        "TRACERL_LAKE": lambda v: setattr(cfg, "lake_root", Path(v)),
        "TRACERL_KAFKA_BOOTSTRAP": lambda v: setattr(cfg.kafka, "bootstrap_servers", v),
        "MLFLOW_TRACKING_URI": lambda v: setattr(cfg.mlflow, "tracking_uri", v),
    }
    for name, setter in env.items():
        if os.environ.get(name):
            setter(os.environ[name])
    _apply(cfg, overrides, "overrides")
    return cfg
