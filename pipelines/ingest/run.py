"""One ingest run: a bounded batch from Kafka, landed exactly once in the lake.

Order of operations, and why it is exactly-once:

1. consume a bounded batch with the consumer group, auto-commit off;
2. under the lake lock: recover any crashed run, drop records at or below the
   lake's own watermark for their partition (landed by an earlier run, even
   one that crashed before committing to Kafka, or by a concurrent consumer);
3. validate each record; failures go to `quarantine` with their raw bytes;
   valid events are de-duplicated by `event_id` (within the batch and against
   the partitions they land in), so a producer's retry is one row;
4. stage Parquet files (fsync), commit the manifest (atomic rename: the point
   of no return), move files into place;
5. only then commit offsets to Kafka. A crash anywhere re-runs cleanly.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipelines.config import TracerlConfig
from pipelines.contract.validate import ValidationError, decode_message, parse_time
from pipelines.faults import failpoint
from pipelines.ingest.tables import EVENTS_SCHEMA, QUARANTINE_SCHEMA, Columns, ms
from pipelines.lake.store import EVENTS, QUARANTINE, Lake
from pipelines.services.kafka import client_options


class IngestError(RuntimeError):
    pass


@dataclass
class IngestResult:
    run_id: str
    consumed: int = 0
    landed: int = 0
    quarantined: int = 0
    duplicates: int = 0          # same event_id seen before: a producer retry
    already_landed: int = 0      # offsets the lake already held (replay after a crash)
    reasons: dict[str, int] = field(default_factory=dict)
    offsets: dict[str, list[int]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    recovered: dict[str, int] = field(default_factory=dict)
    kafka_commit: str = "skipped"
    seconds: float = 0.0

    @property
    def quarantine_rate(self) -> float:
        valid_or_bad = self.landed + self.quarantined + self.duplicates
        return self.quarantined / valid_or_bad if valid_or_bad else 0.0


def open_consumer(cfg: TracerlConfig, lake: Lake, group_id: str | None = None, topic: str | None = None):
    from kafka import ConsumerRebalanceListener, KafkaConsumer

    topic = topic or cfg.kafka.topic
    consumer = KafkaConsumer(
        **client_options(cfg),
        group_id=group_id or cfg.kafka.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=cfg.kafka.session_timeout_ms,
        heartbeat_interval_ms=cfg.kafka.heartbeat_interval_ms,
        max_poll_records=cfg.ingest.max_poll_records,
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=64 << 20,
    )
    if topic not in consumer.topics():
        consumer.close()
        raise IngestError(f"topic {topic!r} does not exist on {client_options(cfg)['bootstrap_servers']}")

    class SeekPastLake(ConsumerRebalanceListener):
        """The lake's watermark wins over Kafka's committed offset: it is what truly landed."""

        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            marks = lake.watermarks()
            for tp in assigned:
                high = marks.get(f"{tp.topic}:{tp.partition}")
                if high is not None:
                    consumer.seek(tp, high + 1)

    consumer.subscribe([topic], listener=SeekPastLake())
    return consumer


def poll_batch(consumer: Any, cfg: TracerlConfig, max_events: int) -> list:
    """Poll until `max_events`, `idle_seconds` without data, or the run's time budget."""
    ic = cfg.ingest
    records: list = []
    start = time.monotonic()
    idle_since: float | None = None
    while len(records) < max_events and time.monotonic() - start < ic.max_run_seconds:
        batch = consumer.poll(timeout_ms=200, max_records=min(ic.max_poll_records, max_events - len(records)))
        got = 0
        for msgs in batch.values():
            records.extend(msgs)
            got += len(msgs)
        now = time.monotonic()
        if got:
            idle_since = None
        elif consumer.assignment() or now - start > ic.join_timeout_seconds:
            idle_since = idle_since or now
            if now - idle_since >= ic.idle_seconds:
                break
    return records


def _existing_ids(lake: Lake, tenant: str, date: str, ids: list[str]) -> set[str]:
    folder = lake.dataset(EVENTS) / f"tenant={tenant}" / f"date={date}"
    files = sorted(folder.glob("*.parquet")) if folder.exists() else []
    if not files:
        return set()
    table = ds.dataset(files, format="parquet").to_table(
        columns=["event_id"], filter=pc.field("event_id").isin(pa.array(ids, pa.string())))
    return set(table.column("event_id").to_pylist())


def land(lake: Lake, records: list, cfg: TracerlConfig, result: IngestResult) -> None:
    """Validate, de-duplicate and commit `records` to the lake (steps 2-4 above)."""
    now_ms = int(time.time() * 1000)
    with lake.locked():
        result.recovered = lake.recover()
        high = {tp: off for tp, off in lake.watermarks().items()}
        pending: dict[tuple[str, str], list[tuple]] = defaultdict(list)
        quarantine: dict[str, Columns] = {}
        seen: set[str] = set()
        offsets: dict[str, list[int]] = {}
        for r in records:
            tp = f"{r.topic}:{r.partition}"
            if r.offset <= high.get(tp, -1):
                result.already_landed += 1
                continue
            high[tp] = r.offset
            span = offsets.setdefault(tp, [r.offset, r.offset])
            span[1] = r.offset
            try:
                e = decode_message(r.value, cfg.ingest.max_event_bytes)
            except ValidationError as err:
                ts = r.timestamp if r.timestamp and r.timestamp > 0 else now_ms
                day = datetime.fromtimestamp(ts / 1000, timezone.utc).date().isoformat()
                q = quarantine.setdefault(day, Columns(QUARANTINE_SCHEMA))
                for name, v in zip(q.cols, (err.reason, str(err), r.value, r.key, r.topic, r.partition,
                                            r.offset, ts, now_ms, result.run_id)):
                    q.cols[name].append(v)
                result.reasons[err.reason] = result.reasons.get(err.reason, 0) + 1
                continue
            eid = e["event_id"]
            if eid in seen:
                result.duplicates += 1
                continue
            seen.add(eid)
            t = parse_time(e["event_time"]).astimezone(timezone.utc)
            pending[(e["tenant"], t.date().isoformat())].append((
                eid, e["type"], e["schema_version"], e["app"], e.get("task"), e["trace_id"],
                e.get("turn_id"), ms(t), r.value.decode(), r.topic, r.partition, r.offset,
                now_ms, result.run_id,
            ))
        if not offsets:
            return
        txn = lake.begin(result.run_id)
        for (tenant, day), rows in sorted(pending.items()):
            known = _existing_ids(lake, tenant, day, [row[0] for row in rows])
            if known:
                result.duplicates += sum(row[0] in known for row in rows)
                rows = [row for row in rows if row[0] not in known]
            if rows:
                cols = Columns(EVENTS_SCHEMA)
                for name, values in zip(cols.cols, zip(*rows)):
                    cols.cols[name] = list(values)
                result.files.append(txn.stage(EVENTS, {"tenant": tenant, "date": day}, cols.table()))
                result.landed += len(rows)
        for day, q in sorted(quarantine.items()):
            result.files.append(txn.stage(QUARANTINE, {"date": day}, q.table()))
            result.quarantined += len(q)
        failpoint("ingest.after_stage")
        result.offsets = offsets
        txn.commit(offsets, {"landed": result.landed, "quarantined": result.quarantined,
                             "duplicates": result.duplicates})
        failpoint("ingest.after_manifest")
        txn.publish()
        failpoint("ingest.after_publish")


def commit_offsets(consumer: Any, offsets: dict[str, list[int]]) -> str:
    from kafka import TopicPartition
    from kafka.errors import CommitFailedError, KafkaError
    from kafka.structs import OffsetAndMetadata

    if not offsets:
        return "skipped"
    commit = {}
    for tp, (_, last) in offsets.items():
        topic, part = tp.rsplit(":", 1)
        commit[TopicPartition(topic, int(part))] = OffsetAndMetadata(last + 1, "", -1)
    try:
        consumer.commit(commit)
        return "ok"
    except (CommitFailedError, KafkaError) as e:
        # Safe: the lake's watermark already records these offsets as landed.
        return f"failed ({type(e).__name__}); the lake watermark covers it"


def run_ingest(cfg: TracerlConfig, max_events: int | None = None, group_id: str | None = None,
               topic: str | None = None) -> IngestResult:
    started = time.monotonic()
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    result = IngestResult(run_id=run_id)
    lake = Lake(cfg.lake)
    consumer = open_consumer(cfg, lake, group_id, topic)
    try:
        records = poll_batch(consumer, cfg, max_events or cfg.ingest.max_events)
        result.consumed = len(records)
        land(lake, records, cfg, result)
        result.kafka_commit = commit_offsets(consumer, result.offsets)
    finally:
        consumer.close(autocommit=False)
    result.seconds = time.monotonic() - started
    return result
