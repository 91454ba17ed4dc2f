"""tracerl's configuration: one typed place for every setting and path, at the ground of the layers.

Defaults run everything embedded and local under `.tracerl/`. A user points a stage at their own
services by configuration only: a `tracerl.toml` file (path in `TRACERL_CONFIG`, else
`./tracerl.toml`) and a few env overrides:

    TRACERL_HOME                 state folder (default ./.tracerl)
    TRACERL_KAFKA_BOOTSTRAP      e.g. "broker1:9092,broker2:9092" (unset = embedded)
    TRACERL_LAKE                 lake root (default $TRACERL_HOME/lake)
    TRACERL_TABLES_URI           the lake's Delta tables on an object store, "s3://bucket/prefix"
    MLFLOW_TRACKING_URI          tracking store (unset = embedded SQLite)

One module per section (kafka, ingest, mlflow, learner, train, gate, serve, gateway, reward, canary,
judge), the tree in `tracerl.py` (with per tenant/task overrides, `TracerlConfig.for_target`), the loader in
`load.py`, the one validator in `parse.py` (pydantic; why: see there). Nothing here imports a
stage: the stages import their section from here. docs/configuration.md lists every setting.

Example `tracerl.toml`:

    [kafka]
    bootstrap_servers = "kafka-1:9093"
    security_protocol = "SASL_SSL"

    [targets."acme/concise".train.optimizer]
    lr = 1e-4
"""

from pipelines.config.gate import TESTS, GateConfig, SignatureConfig, gate_config
from pipelines.config.gateway import GatewayConfig
from pipelines.config.ingest import IngestConfig
from pipelines.config.judge import JudgeConfig
from pipelines.config.canary import CanaryConfig, Guardrail
from pipelines.config.kafka import KAFKA_PASSTHROUGH, KafkaConfig
from pipelines.config.learner import LearnerConfig
from pipelines.config.load import ENV, load_config
from pipelines.config.mlflow import MlflowConfig
from pipelines.config.parse import ConfigError
from pipelines.config.reward import RewardConfig
from pipelines.config.serve import ServeConfig
from pipelines.config.tables import TableStore, TablesConfig
from pipelines.config.tracerl import PER_TARGET, TracerlConfig
from pipelines.config.train import (
    KTOObjective,
    LoraSettings,
    Objective,
    OptimizerSettings,
    PolicyGradientObjective,
    StalenessSettings,
    TrainConfig,
)

__all__ = [
    "CanaryConfig", "ENV", "Guardrail", "KAFKA_PASSTHROUGH", "PER_TARGET", "TESTS", "ConfigError", "GateConfig",
    "GatewayConfig",
    "IngestConfig", "JudgeConfig", "KTOObjective", "KafkaConfig", "LearnerConfig", "LoraSettings", "MlflowConfig",
    "Objective", "OptimizerSettings", "PolicyGradientObjective", "RewardConfig", "ServeConfig",
    "SignatureConfig", "StalenessSettings", "TableStore", "TablesConfig", "TracerlConfig", "TrainConfig", "gate_config", "load_config",
]
