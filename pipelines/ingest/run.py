"""One ingest run: a bounded batch from Kafka, landed exactly once in the lake.

Order of operations, and why it is exactly-once:

1. consume a bounded batch with the consumer group, auto-commit off;
2. under the lake lock: recover any crashed run, drop records at or below the
   lake's own watermark for their partition (landed by an earlier run, even
   one that crashed before committing to Kafka, or by a concurrent consumer);
3. validate each record (decoded in a worker process while polling goes on,
   see `decode.py`); failures go to `quarantine` with their raw bytes;
   valid events are de-duplicated by (tenant, `event_id`) (within the batch and
   against the tenant's partitions they land in), so a producer's retry is one
   row and one tenant's ids never hide another's events. Decode is total; if
   a chunk still raises, it is bisected down to the messages that raise, which
   are quarantined as `internal_error` while the rest lands (`decode.Decoder`);
4. stage Parquet files (fsync), commit the manifest (atomic rename: the point
   of no return), move files into place;
5. only then commit offsets to Kafka. A crash anywhere re-runs cleanly.
"""

from __future__ import annotations

import gc
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipelines.config import TracerlConfig
from pipelines.faults import failpoint
from pipelines.ingest.decode import EVENTS_WITH_ROUTING, PAYLOAD, Chunk, Decoder, payload_column
from pipelines.lake.tables import EVENTS_SCHEMA, QUARANTINE_SCHEMA
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
    duplicates: int = 0          # same (tenant, event_id) seen before: a producer retry
    already_landed: int = 0      # offsets the lake already held (replay after a crash)
    reasons: dict[str, int] = field(default_factory=dict)
    offsets: dict[str, list[int]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    recovered: dict[str, int] = field(default_factory=dict)
    kafka_commit: str = "skipped"
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # join, poll, land, commit (seconds)
    topic_ids: dict[str, str] = field(default_factory=dict)  # Kafka topic ids read (watermark identity)
    isolated: str | None = None  # the decode failure that made this run bisect its batch, if any

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
    topic_ids = topic_id_of(consumer, topic)

    class SeekPastLake(ConsumerRebalanceListener):
        """The lake's watermark wins over Kafka's committed offset: it is what truly landed."""

        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            marks = lake.watermarks(topic_ids)
            for tp in assigned:
                high = marks.get(f"{tp.topic}:{tp.partition}")
                if high is not None:
                    consumer.seek(tp, high + 1)

    consumer.subscribe([topic], listener=SeekPastLake())
    return consumer


def topic_id_of(consumer: Any, topic: str) -> dict[str, str]:
    """{topic: its Kafka topic id} (KIP-516, Kafka 2.8+), or {} where the broker has none.

    The lake keys its watermarks by this id, so a topic deleted and created again (offsets
    starting over, e.g. a restarted in-memory broker) is read from its start, not skipped."""
    tid = consumer._client.cluster.topic_id(topic)  # kafka-python keeps it from the metadata response
    return {topic: str(tid)} if tid else {}


def poll_batch(consumer: Any, cfg: TracerlConfig, max_events: int,
               decoder: Decoder | None = None) -> tuple[list, float | None]:
    """Poll until `max_events`, `idle_seconds` without data, or the run's time budget.

    Returns the records and when the first one arrived (group join ends there)."""
    ic = cfg.ingest
    records: list = []
    start = time.monotonic()
    idle_since: float | None = None
    first: float | None = None
    while len(records) < max_events and time.monotonic() - start < ic.max_run_seconds:
        batch = consumer.poll(timeout_ms=200, max_records=min(ic.max_poll_records, max_events - len(records)))
        got = 0
        for msgs in batch.values():
            records.extend(msgs)
            got += len(msgs)
            if decoder and msgs:
                decoder.submit(Chunk(msgs[0].topic, msgs[0].partition, len(records) - len(msgs),
                                     [m.offset for m in msgs], [m.timestamp for m in msgs],
                                     [m.key for m in msgs], [m.value for m in msgs]))
        now = time.monotonic()
        if got:
            idle_since = None
            first = first or now
        elif consumer.assignment() or now - start > ic.join_timeout_seconds:
            idle_since = idle_since or now
            if now - idle_since >= ic.idle_seconds:
                break
    return records, first


def _existing_ids(lake: Lake, tenant: str, date: str, ids: pa.ChunkedArray) -> pa.Array | None:
    """Which of `ids` the lake already holds in the partition they would land in."""
    folder = lake.dataset(EVENTS) / f"tenant={tenant}" / f"date={date}"
    files = sorted(folder.glob("*.parquet")) if folder.exists() else []
    if not files:
        return None
    table = ds.dataset(files, format="parquet").to_table(
        columns=["event_id"], filter=pc.field("event_id").isin(ids.combine_chunks()))
    return table.column("event_id").combine_chunks()


def _first_occurrences(table: pa.Table, key: list[str]) -> pa.Table:
    """Rows whose `key` columns' values have not appeared together in an earlier row (keep-first dedupe)."""
    if table.num_rows == 0:
        return table
    indexed = table.select(key).append_column("_i", pa.array(range(table.num_rows), pa.int64()))
    first = indexed.group_by(key, use_threads=False).aggregate([("_i", "min")]).column("_i_min")
    if len(first) == table.num_rows:
        return table  # the common case: no duplicates, no copy of the payloads
    first = first.combine_chunks()
    return table.take(first.take(pc.array_sort_indices(first)))


def land(lake: Lake, records: list, decoder: Decoder, result: IngestResult) -> None:
    """Filter, de-duplicate and commit a decoded batch to the lake (steps 2-4 above)."""
    with lake.locked():
        result.recovered = lake.recover()
        high = {tuple(k.rsplit(":", 1)): v for k, v in lake.watermarks(result.topic_ids).items()}
        high = {(t, int(p)): v for (t, p), v in high.items()}
        keep = [False] * len(records)
        spans: dict[tuple[str, int], list[int]] = {}
        for i, r in enumerate(records):
            tp = (r.topic, r.partition)
            if r.offset <= high.get(tp, -1):
                continue  # landed before: a replay after a crash, or a concurrent consumer's
            high[tp] = r.offset
            keep[i] = True
            span = spans.get(tp)
            if span:
                span[1] = r.offset
            else:
                spans[tp] = [r.offset, r.offset]
        result.already_landed = len(records) - sum(keep)
        if not spans:
            return
        events, quarantine = decoder.results()
        if result.already_landed:
            fresh = pa.array(keep, pa.bool_())
            events = events.filter(fresh.take(events.column("row")))
            quarantine = quarantine.filter(fresh.take(quarantine.column("row")))
        result.isolated = decoder.failure
        unique = _first_occurrences(events, ["tenant", "event_id"])
        values = [r.value for r in records]
        result.duplicates = events.num_rows - unique.num_rows
        txn = lake.begin(result.run_id)
        parts = unique.select(["tenant", "day"]).group_by(["tenant", "day"]).aggregate([]).to_pylist()
        for part in parts:
            tenant, day = part["tenant"], part["day"]
            rows = unique if len(parts) == 1 else unique.filter(
                pc.and_(pc.equal(unique.column("tenant"), tenant), pc.equal(unique.column("day"), day)))
            known = _existing_ids(lake, tenant, day, rows.column("event_id"))
            if known is not None:
                new = pc.invert(pc.is_in(rows.column("event_id"), known))
                result.duplicates += rows.num_rows - pc.sum(new).as_py()
                rows = rows.filter(new)
            if rows.num_rows:
                rows = rows.add_column(PAYLOAD, EVENTS_WITH_ROUTING.field(PAYLOAD),
                                       payload_column(values, rows.column("row")))
                rows = rows.select(EVENTS_SCHEMA.names)  # still in Kafka order
                result.files.append(txn.stage(EVENTS, {"tenant": tenant, "date": day}, rows))
                result.landed += rows.num_rows
        for day in sorted(set(quarantine.column("day").to_pylist())):
            rows = quarantine.filter(pc.field("day") == day).select(QUARANTINE_SCHEMA.names)
            result.files.append(txn.stage(QUARANTINE, {"date": day}, rows))
            result.quarantined += rows.num_rows
        for reason in quarantine.column("reason").to_pylist():
            result.reasons[reason] = result.reasons.get(reason, 0) + 1
        offsets = {f"{t}:{p}": span for (t, p), span in spans.items()}
        failpoint("ingest.after_stage")
        result.offsets = offsets
        txn.commit(offsets, {"landed": result.landed, "quarantined": result.quarantined,
                             "duplicates": result.duplicates}, result.topic_ids)
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
    result.topic_ids = topic_id_of(consumer, topic or cfg.kafka.topic)
    # A batch holds ~1e5 records alive; the cyclic GC would rescan them all on every
    # collection (measured: 3x slower polling). Nothing here creates cycles.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    now_ms = int(time.time() * 1000)
    decoder = Decoder(cfg.ingest.max_event_bytes, cfg.ingest.decode_workers, run_id, now_ms,
                      cfg.ingest.decode_parallel_from, cfg.ingest.topic_tenants)
    try:
        records, first = poll_batch(consumer, cfg, max_events or cfg.ingest.max_events, decoder)
        polled = time.monotonic()
        result.consumed = len(records)
        land(lake, records, decoder, result)
        landed = time.monotonic()
        result.kafka_commit = commit_offsets(consumer, result.offsets)
        first = first or polled
        result.timings = {"join": round(first - started, 3), "poll": round(polled - first, 3),
                          "land": round(landed - polled, 3), "commit": round(time.monotonic() - landed, 3)}
    finally:
        decoder.close()
        if gc_was_enabled:
            gc.enable()
        consumer.close(autocommit=False)
    result.seconds = time.monotonic() - started
    return result
