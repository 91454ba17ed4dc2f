"""Resources: how Dagster reaches tracerl's configuration and services.

`TracerlResource` is the settings (tracerl.toml, loaded again by every run). Each external service
is one resource over it (Dagster's resource-to-resource dependency): `KafkaResource`,
`LakeResource`, `MlflowResource`, `GatewayResource`. An asset asks for the services it touches,
so the UI shows what each one reaches; all of them read the one `tracerl` resource, so one
tracerl.toml configures everything and the run config of `tracerl` alone sets them all. The
embedded-vs-external choice of every service lives in that config, not in asset code; the
resources are thin doors onto pipelines/, which holds the logic.

(No `from __future__ import annotations` here: Dagster reads the `tracerl` field's type to see it
is a nested resource.)
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from assets.links import model_version_url, run_url
from pipelines.config import TracerlConfig, load_config

if TYPE_CHECKING:
    import duckdb

    from pipelines.deploy.operations import ActionResult
    from pipelines.deploy.reconcile import ReconcileReport
    from pipelines.ingest.offsets import LakeLag
    from pipelines.ingest.run import IngestResult

BOOTSTRAP_TIMEOUT_MS = 10_000  # an unreachable broker fails the observation after this long


class TracerlResource(dg.ConfigurableResource):
    """tracerl settings: a tracerl.toml path and/or a state folder (env vars apply too).

    Loaded again by every run (``load``), so an edited tracerl.toml or reward spec is picked up
    without restarting Dagster.
    """

    config_path: str | None = None   # None: $TRACERL_CONFIG, else ./tracerl.toml (none is fine)
    home: str | None = None          # overrides `home`
    reward_spec: str | None = None   # overrides `reward.spec` (per-target entries still win), e.g. the
                                     # simulator's spec for an in-process demo run
    targets_json: str | None = None  # JSON merged over `targets` (per-target entries), e.g. the canary
                                     # demo's {"acme/concise": {"canary": {"enabled": true, ...}}}

    def load(self) -> TracerlConfig:
        import json

        overrides: dict = {"home": self.home} if self.home else {}
        if self.reward_spec:
            overrides["reward"] = {"spec": self.reward_spec}
        if self.targets_json:
            overrides["targets"] = json.loads(self.targets_json)
        return load_config(self.config_path, **overrides)


class ServiceResource(dg.ConfigurableResource):
    """A service reached through the tracerl settings (the nested `tracerl` resource)."""

    tracerl: TracerlResource

    def settings(self) -> TracerlConfig:
        """The whole configuration, read now (pipelines/ functions take it whole)."""
        return self.tracerl.load()


class KafkaResource(ServiceResource):
    """Kafka: the events topic (`[kafka]`: embedded broker or your cluster). Its end offsets and the
    ingest consumer group's lag, and the exactly-once ingest of one batch into the lake."""

    def offsets(self) -> dict[str, Any]:
        """End offsets of the events topic per partition, and the ingest group's committed offsets.

        Raises `dg.Failure` naming the bootstrap servers when Kafka cannot be reached."""
        return topic_offsets(self.settings())

    def lag(self) -> "LakeLag":
        """How far the lake trails the topic, from the lake's watermarks (pipelines/ingest/offsets.py)."""
        from pipelines.ingest.offsets import lake_lag

        return lake_lag(self.settings())

    def ingest(self, max_events: int | None = None) -> "IngestResult":
        """One bounded batch from the topic into the lake, exactly once (pipelines/ingest/run.py)."""
        from pipelines.ingest.run import run_ingest

        return run_ingest(self.settings(), max_events=max_events)


class LakeResource(ServiceResource):
    """The lake (`lake_root`, default <home>/lake; its Delta tables where `[tables]` says): its
    folder and DuckDB views over it (events, rewards, the trained-turns ledger)."""

    def root(self) -> Path:
        return self.settings().lake

    def connect(self) -> "duckdb.DuckDBPyConnection":
        """An in-memory DuckDB with a view per lake table (pipelines/lake/query.py)."""
        from pipelines.lake.query import connect

        cfg = self.settings()
        return connect(cfg.lake, cfg.table_store)


class MlflowResource(ServiceResource):
    """MLflow (`[mlflow]`: the embedded SQLite store or your tracking server): runs, the model
    registry and its aliases, and links into its UI."""

    def tracking_uri(self) -> str:
        """The tracking and registry store: `mlflow.tracking_uri`, else the SQLite store under home."""
        return self.settings().tracking_uri

    def use_store(self) -> str:
        """Point MLflow's fluent API at this store without exporting MLFLOW_TRACKING_URI (which would
        override the next run's tracerl.toml); returns its URI."""
        from pipelines.tracking import use_store

        uri = self.tracking_uri()
        use_store(uri)
        return uri

    def model_version_url(self, tenant: str, task: str, version: str | int) -> dg.MetadataValue:
        return model_version_url(self.settings(), tenant, task, version)

    def run_url(self, run_id: str) -> dg.MetadataValue:
        return run_url(self.settings(), run_id)

    def champion(self, tenant: str, task: str) -> dict[str, Any] | None:
        """The `champion` alias's registry and adapter versions, now; None when there is none."""
        from pipelines.adapters.promote import alias_version
        from pipelines.adapters.registry import CHAMPION
        from pipelines.adapters.version import tag_version

        mv = alias_version(self.settings(), tenant, task, CHAMPION)
        return None if mv is None else {"registry_version": str(mv.version), "adapter_version": tag_version(mv)}

    def pending_approvals(self) -> list[tuple[str, str, str]]:
        """(tenant, task, registry version) of held versions a reviewer tagged approved in the UI."""
        from pipelines.adapters.promote import all_pending_approvals
        from pipelines.config import gate_config

        cfg = self.settings()
        return all_pending_approvals(cfg, gate_config(cfg).approval_tag)


class GatewayResource(ServiceResource):
    """The gateway (`[gateway]`, what `tracerl serve` runs in front of vLLM): reconciling its routes
    to the registry's champions (hot swaps), approvals that end in a swap, and its health."""

    def reconcile(self, targets: list[tuple[str, str]] | None = None, who: str = "dagster") -> "ReconcileReport":
        """Hot-swap every target whose live version differs from its `champion` (all when None)."""
        from pipelines.deploy.reconcile import reconcile

        return reconcile(self.settings(), targets, who=who)

    def approve_tagged(self) -> "list[ActionResult]":
        """Approve the held versions a reviewer tagged in the MLflow UI, then serve them (like
        `tracerl approve`)."""
        from pipelines.config import gate_config
        from pipelines.deploy.operations import approve_tagged

        cfg = self.settings()
        return approve_tagged(cfg, gate_config(cfg).approval_tag)

    def health(self) -> str:
        """"running on <url> (pid N)", or how to start it (pipelines/stack.py's status)."""
        from pipelines.stack import status

        state = status(self.settings(), "gateway")
        return "stopped (start it: tracerl start gateway)" if state == "stopped" else state


def service_resources(tracerl: TracerlResource | Any) -> dict[str, ServiceResource | TracerlResource | Any]:
    """Every resource the code location binds, each service over the one `tracerl` settings
    resource: what definitions.py uses, and what a test or one-off run passes to `dg.materialize`."""
    return {"tracerl": tracerl, "kafka": KafkaResource(tracerl=tracerl), "lake": LakeResource(tracerl=tracerl),
            "mlflow": MlflowResource(tracerl=tracerl), "gateway": GatewayResource(tracerl=tracerl)}


def topic_offsets(cfg: TracerlConfig) -> dict[str, Any]:
    """End offsets of the events topic per partition, and the offsets ingest committed to its group
    (for Kafka's own lag tools; the lake's lag is `KafkaResource.lag`).

    Raises `dg.Failure` naming the bootstrap servers when Kafka cannot be reached."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    from pipelines.services.kafka import BrokerError, client_options

    topic = cfg.kafka.topic
    try:
        options = client_options(cfg)
    except BrokerError as e:
        raise dg.Failure(description=f"cannot observe Kafka topic {topic!r}: {e}") from e
    servers = options["bootstrap_servers"]
    consumer = None
    try:
        # group_id only for reading its committed offsets: this consumer never subscribes, so it
        # never joins the group and never moves the ingest consumer's partitions.
        consumer = KafkaConsumer(**options, group_id=cfg.kafka.group_id, enable_auto_commit=False,
                                 bootstrap_timeout_ms=BOOTSTRAP_TIMEOUT_MS)
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise dg.Failure(description=f"Kafka topic {topic!r} does not exist on {servers}",
                             metadata={"bootstrap_servers": servers, "topic": topic})
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        end = consumer.end_offsets(tps)
        committed = {tp: consumer.committed(tp) for tp in tps}
    except KafkaError as e:
        raise dg.Failure(description=f"Kafka at {servers} is unreachable (topic {topic!r}): "
                                     f"{type(e).__name__}: {e}",
                         metadata={"bootstrap_servers": servers, "topic": topic}) from e
    finally:
        if consumer is not None:
            consumer.close(autocommit=False)
    return {
        "bootstrap_servers": servers, "topic": topic, "group_id": cfg.kafka.group_id,
        "end_offsets": {str(tp.partition): end[tp] for tp in tps},
        "committed_offsets": {str(tp.partition): committed[tp] for tp in tps},
        "end_offset_total": sum(end.values()),
    }
