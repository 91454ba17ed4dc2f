"""``TracerlConfig``: the whole settings tree, and the effective settings of one tenant/task.

Per-target settings: ``[targets."<tenant>"]`` and ``[targets."<tenant>/<task>"]`` hold partial
``learner``, ``train``, ``gate``, ``reward``, ``canary``, ``judge`` and ``privacy`` tables, deep-merged over the global sections:
tenant/task entry over tenant entry over global (``for_target``). They are checked when the config
is built, by the same types, so an unknown key or a bad value in an override fails at load time.
The other sections are process-wide: one broker, one lake, one tracking store, one vLLM and one
gateway serve every tenant.
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Any

from pydantic.dataclasses import dataclass

from pipelines.config.canary import CanaryConfig
from pipelines.config.gate import GateConfig
from pipelines.config.gateway import GatewayConfig
from pipelines.config.ingest import IngestConfig
from pipelines.config.judge import JudgeConfig
from pipelines.config.kafka import KafkaConfig
from pipelines.config.learner import LearnerConfig
from pipelines.config.mlflow import MlflowConfig
from pipelines.config.parse import SECTION, ConfigError, merge, parse, plain
from pipelines.config.privacy import PrivacyConfig
from pipelines.config.reward import RewardConfig
from pipelines.config.serve import ServeConfig
from pipelines.config.tables import TableStore, TablesConfig
from pipelines.config.train import TrainConfig
from pipelines.contract.validate import IDENT

PER_TARGET = ("learner", "train", "gate", "reward", "canary", "judge", "privacy")  # sections a [targets."..."] entry may override
PER_TENANT_ONLY = ("privacy",)  # ... in a [targets."<tenant>"] entry only, never a "<tenant>/<task>" one


@dataclass(config=SECTION)
class TracerlConfig:
    """Every setting and path of a deployment (docs/configuration.md lists each field)."""

    home: Path = Path(".tracerl")        # state folder: run/, logs/, adapters/, models/, deploy/, ...
    lake_root: Path | None = None        # None = <home>/lake
    tables: TablesConfig = field(default_factory=TablesConfig)  # where events/quarantine live
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    # "<tenant>" or "<tenant>/<task>" -> partial {learner, train, gate, reward, canary, judge, privacy} tables (TOML-shaped)
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.train.lora.r > self.serve.max_lora_rank:
            raise ValueError(f"train.lora.r={self.train.lora.r} > serve.max_lora_rank={self.serve.max_lora_rank}: "
                             f"vLLM could not host the adapter; lower r or raise serve.max_lora_rank")
        for key in self.targets:
            self._check_target(key)

    # -- paths ----------------------------------------------------------------------------------

    @property
    def lake(self) -> Path:
        return self.lake_root or self.home / "lake"

    @property
    def table_store(self) -> TableStore:
        """Where the lake's Delta tables are: the lake folder, or ``tables.uri`` on an object store."""
        return self.tables.store(self.lake)

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
    def routes_path(self) -> Path:
        """What the gateway serves (its router's state), as reconcile, the canary steps and the
        tables read it; a gateway with an ``instance`` of several keeps its own under
        ``gateways/<instance>/`` (``pipelines.deploy.service.gateway_dirs``)."""
        return self.home / "deploy" / "routes.json"

    def gate_replies_dir(self, tenant: str, task: str) -> Path:
        """Eval replies the gate keeps per set of weights (pipelines/gate/reply_cache.py), one
        folder per target: a tenant's private eval replies are never read for another's."""
        return self.home / "gate_replies" / tenant / task

    @property
    def tracking_uri(self) -> str:
        return self.mlflow.tracking_uri or f"sqlite:///{(self.home / 'mlflow.db').resolve()}"

    @property
    def artifact_root(self) -> Path:
        return (self.home / "mlartifacts").resolve()

    # -- (de)serialising and per-target settings -------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """TOML-shaped (paths as strings, tuples as lists); ``from_dict`` gives an equal config."""
        return plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "TracerlConfig":
        return parse(cls, data, source)

    def for_target(self, tenant: str, task: str | None = None) -> "TracerlConfig":
        """The settings ``tenant``/``task`` runs with: its ``targets`` entries over the globals.

        Returns ``self`` when no entry names the target (so in-code tweaks of a config stay
        visible); else a new config, built from this one's current values. It keeps ``targets``,
        so asking it again for the same target gives equal settings.
        """
        entries = self._entries(tenant, task)
        if not entries:
            return self
        return self._effective(entries, _where("/".join(x for x in (tenant, task) if x)))

    def _entries(self, tenant: str, task: str | None) -> list[dict[str, Any]]:
        keys = [tenant] + ([f"{tenant}/{task}"] if task is not None else [])
        return [self.targets[k] for k in keys if k in self.targets]

    def _effective(self, entries: list[dict[str, Any]], source: str) -> "TracerlConfig":
        raw = {k: v for k, v in self.to_dict().items() if k != "targets"}
        for entry in entries:
            raw = merge(raw, entry)
        cfg = parse(TracerlConfig, raw, source)
        cfg.targets = self.targets  # not re-validated: checked when this config was built
        return cfg

    def _check_target(self, key: str) -> None:
        where = _where(key)
        tenant, _, task = key.partition("/")
        if not IDENT.fullmatch(tenant) or (task and not IDENT.fullmatch(task)) or key.count("/") > 1:
            raise ConfigError(f"{where}: expected \"<tenant>\" or \"<tenant>/<task>\", each matching {IDENT.pattern}")
        entry = self.targets[key]
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} = {entry!r}: expected a table of {', '.join(PER_TARGET)} settings")
        other = sorted(set(entry) - set(PER_TARGET))
        if other:
            raise ConfigError(f"{where}: {', '.join(other)} cannot be set per target (one broker, lake, store, "
                              f"vLLM and gateway serve every tenant); per-target sections: {', '.join(PER_TARGET)}")
        if isinstance(entry.get("train"), dict) and "base_model" in entry["train"]:
            raise ConfigError(f"{where}.train.base_model: one base model serves every adapter (vLLM hosts them "
                              f"all on it); set train.base_model globally")
        self._effective(self._entries(tenant, task or None), where)
        per_tenant = sorted(set(entry) & set(PER_TENANT_ONLY)) if task else []
        if per_tenant:
            raise ConfigError(f"{where}: {', '.join(per_tenant)} is set per tenant, not per task (feedback and tool "
                              f"outcomes need not name their task): set it in targets.\"{tenant}\"")


def _where(key: str) -> str:
    return f'targets."{key}"'
