"""``[ingest]``: how one ingest run consumes one bounded batch."""

from __future__ import annotations

from dataclasses import field

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION
from pipelines.contract.validate import IDENT


@dataclass(config=SECTION)
class IngestConfig:
    """One ingest run = one bounded batch, so a Dagster run always finishes."""

    max_events: int = 200_000            # per run; the rest waits for the next run
    max_run_seconds: float = 600.0
    idle_seconds: float = 2.0            # stop once no message arrived for this long
    max_poll_records: int = 5000
    decode_workers: int = 2              # processes decoding JSON beside the poller; 0 = inline.
                                         # 2 measured best on 2 cores (bench/RESULTS.md)
    decode_parallel_from: int = 2000     # smaller polled chunks decode inline (a worker costs a spawn)
    max_event_bytes: int = 1 << 20       # larger messages are quarantined as oversize
    quarantine_rate_limit: float = 0.05  # asset check fails above this share
    # The lake's lag behind Kafka goes red (the `lake_lag` asset check, `tracerl status`, the
    # gateway's /health body) past either bound: the oldest event not in the lake older than this
    # (3 missed ingest runs of the 5-minute schedule), or more events than this waiting.
    lag_alarm_seconds: float = 900.0
    lag_alarm_events: int = 1_000_000
    # Direct Kafka producers: topic -> the one tenant allowed on it; an event on a mapped topic
    # claiming another tenant is quarantined (`tenant_mismatch`). Empty: trust the event's tenant.
    topic_tenants: dict[str, str] = field(default_factory=dict)
    # This worker's partitions of the topic: one worker per partition set (hosts apart; the lake's
    # Delta tables take their appends at once). Empty: every partition of the topic. Ingest never
    # joins a consumer group; it reads from the lake's watermarks (pipelines/ingest/offsets.py).
    partitions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if any(not isinstance(p, int) or p < 0 for p in self.partitions) or len(set(self.partitions)) < len(self.partitions):
            raise ValueError(f"ingest.partitions: {self.partitions!r}: expected distinct partition numbers >= 0")
        for topic, tenant in self.topic_tenants.items():
            if not isinstance(topic, str) or not isinstance(tenant, str) or not IDENT.fullmatch(tenant):
                raise ValueError(f"ingest.topic_tenants: {topic!r} = {tenant!r}: expected a topic name "
                                 f"mapped to a tenant id matching {IDENT.pattern}")
