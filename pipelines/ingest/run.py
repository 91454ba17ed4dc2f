"""One ingest run: a bounded batch from Kafka, landed exactly once in the lake.

Order of operations, and why it is exactly-once:

1. assign this worker's partitions (all of the topic's, or `ingest.partitions`)
   and read each from the lake's own watermark + 1 (the events table's
   application transaction, `pipelines/lake/delta.py`; `offsets.py`): no
   consumer-group join, whose coordination can stall on a broker (issue #40);
2. drop records at or below the watermark as it is when landing (landed by a
   concurrent ingest meanwhile: several ingests at once are safe, the loser of
   a commit decides again from the lake and lands only what is still new);
3. validate each record (decoded in a worker process while polling goes on,
   see `decode.py`); failures go to `quarantine` with their raw bytes;
   valid events are de-duplicated by (tenant, `event_id`) (within the batch and
   against the tenant's partitions they land in), so a producer's retry is one
   row and one tenant's ids never hide another's events. Decode is total; if
   a chunk still raises, it is bisected down to the messages that raise, which
   are quarantined as `internal_error` while the rest lands (`decode.Decoder`);
4. append the quarantine rows, then the events, each a Delta commit carrying
   the last offset of every partition read (the events commit is the point of
   no return; a crash between them re-lands only the events, as the quarantine
   table's own transactions say which offsets it holds, and they never move
   back: `_never_back`);
5. only then commit offsets to the Kafka group, for lag tools only (nothing
   reads them back). A crash anywhere re-runs cleanly.

A run that reads nothing while Kafka holds events past the watermarks fails and
names the cause: ingest never reports a quiet zero over a backlog.
"""

from __future__ import annotations

import gc
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.config import TracerlConfig
from pipelines.faults import failpoint
from pipelines.ingest.decode import Chunk, Decoder, with_payload
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS, QUARANTINE
from pipelines.lake.tables import EVENTS_SCHEMA, QUARANTINE_SCHEMA
from pipelines.privacy.forget_requests import Forgotten, forgotten
from pipelines.ingest.offsets import (IngestError, data_consumer, partitions_of, read_log_end,
                                      resume_offsets, topic_id_of)
from pipelines.services.kafka import client_options


class LandConflict(IngestError):
    """Another ingest committed some of these offsets first; deciding again from the lake is safe."""


@dataclass
class IngestResult:
    run_id: str
    consumed: int = 0
    landed: int = 0
    quarantined: int = 0
    forgotten: int = 0    # events of users `tracerl forget` removed, still in Kafka: not landed (docs/privacy.md)
    duplicates: int = 0          # same (tenant, event_id) seen before: a producer retry
    already_landed: int = 0      # offsets the lake already held (replay after a crash)
    reasons: dict[str, int] = field(default_factory=dict)
    offsets: dict[str, list[int]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)  # table -> the version this run committed
    kafka_commit: str = "skipped"
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # join, poll, land, commit (seconds)
    topic_ids: dict[str, str] = field(default_factory=dict)  # Kafka topic ids read (watermark identity)
    isolated: str | None = None  # the decode failure that made this run bisect its batch, if any

    @property
    def quarantine_rate(self) -> float:
        valid_or_bad = self.landed + self.quarantined + self.duplicates
        return self.quarantined / valid_or_bad if valid_or_bad else 0.0


def open_consumer(cfg: TracerlConfig, topic: str) -> tuple[Any, dict[str, str], dict[int, int]]:
    """A consumer assigned this worker's partitions, each at the lake's watermark + 1 (`offsets.py`):
    (the consumer, {topic: its id}, {partition: the offset it reads next})."""
    from kafka import TopicPartition
    from kafka.errors import KafkaError

    ic = cfg.ingest
    consumer = data_consumer(cfg, max_poll_records=ic.max_poll_records,
                             max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)
    try:
        if topic not in consumer.topics():
            raise IngestError(f"topic {topic!r} does not exist on {client_options(cfg)['bootstrap_servers']}")
        topic_ids = topic_id_of(consumer, topic)
        resume = resume_offsets(consumer, cfg, topic, topic_ids, partitions_of(consumer, cfg, topic))
        consumer.assign([TopicPartition(topic, p) for p in resume])
        for p, (_, at) in resume.items():
            consumer.seek(TopicPartition(topic, p), at)
    except KafkaError as e:
        consumer.close()
        raise IngestError(f"Kafka at {client_options(cfg)['bootstrap_servers']} is unreachable: "
                          f"{type(e).__name__}: {e}") from None
    except BaseException:
        consumer.close()
        raise
    return consumer, topic_ids, {p: at for p, (_, at) in resume.items()}


def poll_batch(consumer: Any, cfg: TracerlConfig, max_events: int,
               decoder: Decoder | None = None) -> tuple[list, float | None]:
    """Poll until `max_events`, `idle_seconds` without data, or the run's time budget.

    Returns the records and when the first one arrived."""
    from kafka.errors import OffsetOutOfRangeError

    ic = cfg.ingest
    records: list = []
    start = time.monotonic()
    idle_since: float | None = None
    first: float | None = None
    while len(records) < max_events and time.monotonic() - start < ic.max_run_seconds:
        try:
            batch = consumer.poll(timeout_ms=200, max_records=min(ic.max_poll_records, max_events - len(records)))
        except OffsetOutOfRangeError as e:
            raise IngestError(f"the lake's watermark is past the end of Kafka's log for {e.args}: the topic was "
                              "deleted and created again under the same id (or truncated); events there are "
                              "not landed. Recreate the topic (a new topic id starts a new watermark) or "
                              "point ingest at a new lake") from None
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
        else:
            idle_since = idle_since or now
            if now - idle_since >= ic.idle_seconds:
                break
    return records, first


def _existing_ids(events: Any, tenant: str, date: str, ids: pa.ChunkedArray) -> pa.Array | None:
    """Which of `ids` the events table (a DeltaTable, or None) holds in the partition they would land in."""
    data = delta.data_in(events, [("tenant", "=", tenant), ("date", "=", date)]) if events else None
    if data is None:
        return None
    # read, then filtered here: a file a Delta delete rewrote (`tracerl forget`) stores its strings as
    # string_view, and a filter pushed into the scan compares them with plain strings (no kernel);
    # random event ids prune no file by their statistics anyway
    held = data.to_table(columns=["event_id"]).column("event_id").combine_chunks().cast(pa.string())
    return held.filter(pc.is_in(held, value_set=ids.combine_chunks().cast(pa.string())))


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


def _as_stored(rows: pa.Table, names: list[str]) -> pa.Table:
    """The columns a table stores and its partition columns (the routing day is `date`)."""
    names = names + (["tenant"] if "tenant" in rows.column_names else [])
    return rows.select(names + ["day"]).rename_columns(names + ["date"])


def _never_back(last: dict[delta.Coord, int], marks: dict[delta.Coord, int]) -> dict[delta.Coord, int]:
    """The quarantine commit's watermarks: this batch's last offsets, but never below the quarantine's own.

    A run killed between its quarantine and events commits leaves the quarantine's watermarks ahead
    of the events'. The next run starts at the events' and may read less of a partition than the
    killed one did (a smaller batch, another order) while quarantining in another; a Delta
    application transaction is simply overwritten, so committing its shorter last offset would move
    that partition's quarantine watermark back, and the run after would quarantine the messages
    between again (issue #40: 77 quarantine rows for 60 bad messages after random kill -9s)."""
    return {c: max(v, marks.get(c, -1)) for c, v in last.items()}


def _not_forgotten(events: pa.Table, gone: Forgotten) -> pa.Array:
    """True for each event that is not of a forgotten user (their pseudonym, at or before the time
    they asked; or one of the traces and turns their forget found): `tracerl forget` has removed
    theirs from the lake, and an event still in Kafka then must not come back."""
    tenants, users = events.column("tenant").to_pylist(), events.column("user_id").to_pylist()
    traces, turns = events.column("trace_id").to_pylist(), events.column("turn_id").to_pylist()
    times = events.column("event_time").to_pylist()
    keep = []
    for tenant, user, trace, turn, at in zip(tenants, users, traces, turns, times):
        asked = gone.users.get((tenant, user))
        keep.append(not ((asked is not None and at is not None and at <= datetime.fromisoformat(asked))
                         or (tenant, trace) in gone.traces or (turn is not None and (tenant, turn) in gone.turns)))
    return pa.array(keep, pa.bool_())


def land(root: delta.Where, records: list, decoder: Decoder, result: IngestResult,
         gone: Forgotten | None = None) -> None:
    """Filter, de-duplicate and commit a decoded batch to the lake (steps 2-4 above). ``gone``: the
    forgotten users (`forget_requests.forgotten`), whose events are not landed (counted)."""
    def coord(topic: str, partition: int) -> delta.Coord:
        return topic, result.topic_ids.get(topic, ""), partition

    tps = {(r.topic, r.partition) for r in records}
    # the snapshots decided from: each commit below is checked against every commit after its own
    table, quarantine_table = delta.open_table(root, EVENTS), delta.open_table(root, QUARANTINE)
    in_events = delta.marks_of(table, [coord(*tp) for tp in tps])
    in_quarantine = delta.marks_of(quarantine_table, [coord(*tp) for tp in tps])
    high = {tp: in_events.get(coord(*tp), -1) for tp in tps}
    keep = [False] * len(records)
    quarantine_keep = [False] * len(records)
    spans: dict[tuple[str, int], list[int]] = {}
    for i, r in enumerate(records):
        tp = (r.topic, r.partition)
        if r.offset <= high[tp]:
            continue  # landed before: a replay after a crash, or a concurrent consumer's
        high[tp] = r.offset
        keep[i] = True
        quarantine_keep[i] = r.offset > in_quarantine.get(coord(*tp), -1)  # else: quarantined by a run cut short
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
        events = events.filter(pa.array(keep, pa.bool_()).take(events.column("row")))
    quarantine = quarantine.filter(pa.array(quarantine_keep, pa.bool_()).take(quarantine.column("row")))
    result.isolated = decoder.failure
    unique = _first_occurrences(events, ["tenant", "event_id"])
    result.duplicates = events.num_rows - unique.num_rows
    new = None
    parts = unique.select(["tenant", "day"]).group_by(["tenant", "day"]).aggregate([]).to_pylist()
    for part in parts:
        known = _existing_ids(table, part["tenant"], part["day"], unique.column("event_id"))
        if known is not None:
            mask = pc.and_(pc.and_(pc.equal(unique.column("tenant"), part["tenant"]),
                                   pc.equal(unique.column("day"), part["day"])),
                           pc.is_in(unique.column("event_id"), known))
            new = pc.invert(mask) if new is None else pc.and_(new, pc.invert(mask))
    if new is not None:
        result.duplicates += unique.num_rows - pc.sum(new).as_py()
        unique = unique.filter(new)  # still in Kafka order
    if gone and unique.num_rows:
        keep_ = _not_forgotten(unique, gone)
        result.forgotten = unique.num_rows - pc.sum(keep_).as_py()
        unique = unique.filter(keep_)
    rows = with_payload(unique, [r.value for r in records])
    result.landed = rows.num_rows
    result.quarantined = quarantine.num_rows
    for reason in quarantine.column("reason").to_pylist():
        result.reasons[reason] = result.reasons.get(reason, 0) + 1
    result.offsets = {f"{t}:{p}": span for (t, p), span in spans.items()}
    last = {coord(*tp): span[1] for tp, span in spans.items()}
    failpoint("ingest.before_commit")
    bases = {d: t if t is not None else delta.NO_TABLE for d, t in ((EVENTS, table), (QUARANTINE, quarantine_table))}
    try:
        if quarantine.num_rows:  # first: the events commit is what marks these offsets landed
            result.versions[QUARANTINE] = delta.append(root, QUARANTINE, _as_stored(quarantine, QUARANTINE_SCHEMA.names),
                                                       _never_back(last, in_quarantine), base=bases[QUARANTINE])
            failpoint("ingest.after_quarantine")
        result.versions[EVENTS] = delta.append(root, EVENTS, _as_stored(rows, EVENTS_SCHEMA.names), last,
                                               base=bases[EVENTS])
    except delta.CommitConflict as err:
        raise LandConflict(f"another ingest worker landed offsets of {sorted(result.offsets)} while this run "
                          f"decoded them; this run committed {sorted(result.versions) or 'nothing'} and "
                          f"decides again from the lake's watermarks ({err})") from None
    failpoint("ingest.after_commit")


def commit_offsets(cfg: TracerlConfig, group_id: str, offsets: dict[str, list[int]]) -> str:
    """Publish the landed offsets as the group's committed offsets, for Kafka's lag tools only:
    ingest never reads them back, so a group the broker cannot coordinate costs a line, not progress."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata

    if not offsets:
        return "skipped"
    commit = {}
    for tp, (_, last) in offsets.items():
        topic, part = tp.rsplit(":", 1)
        commit[TopicPartition(topic, int(part))] = OffsetAndMetadata(last + 1, "", -1)
    consumer = None
    try:
        consumer = KafkaConsumer(**client_options(cfg), group_id=group_id, enable_auto_commit=False)
        consumer.commit(commit, timeout_ms=COMMIT_TIMEOUT_MS)
        return "ok"
    except KafkaError as e:
        # Safe: the lake's watermark already records these offsets as landed.
        return f"failed ({type(e).__name__}); the lake watermark covers it"
    finally:
        if consumer is not None:
            consumer.close(autocommit=False)


COMMIT_TIMEOUT_MS = 5000
LAND_ATTEMPTS = 5  # a land that lost its commit to a concurrent ingest is decided again from the lake


def run_ingest(cfg: TracerlConfig, max_events: int | None = None, group_id: str | None = None,
               topic: str | None = None) -> IngestResult:
    """One bounded batch landed exactly once. Raises IngestError when the run made no progress
    while Kafka holds events the lake does not (the cause in its message): never a quiet zero."""
    started = time.monotonic()
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    result = IngestResult(run_id=run_id)
    topic = topic or cfg.kafka.topic
    consumer, result.topic_ids, resume = open_consumer(cfg, topic)
    # A batch holds ~1e5 records alive; the cyclic GC would rescan them all on every
    # collection (measured: 3x slower polling). Nothing here creates cycles.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    now_ms = int(time.time() * 1000)
    decoder = Decoder(cfg.ingest.max_event_bytes, cfg.ingest.decode_workers, run_id, now_ms,
                      cfg.ingest.decode_parallel_from, cfg.ingest.topic_tenants, home=str(cfg.home))
    try:
        records, first = poll_batch(consumer, cfg, max_events or cfg.ingest.max_events, decoder)
        polled = time.monotonic()
        result.consumed = len(records)
        if not records:
            _check_idle(consumer, topic, resume, polled - started)
        for attempt in range(LAND_ATTEMPTS):
            result.landed = result.quarantined = result.duplicates = result.already_landed = result.forgotten = 0
            result.reasons, result.offsets = {}, {}
            try:
                land(cfg.table_store, records, decoder, result, forgotten(cfg.home))
                break
            except LandConflict:
                if attempt == LAND_ATTEMPTS - 1:
                    raise
        landed = time.monotonic()
        result.kafka_commit = commit_offsets(cfg, group_id or cfg.kafka.group_id, result.offsets)
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


def _check_idle(consumer: Any, topic: str, resume: dict[int, int], seconds: float) -> None:
    """Nothing was read: fine if Kafka holds nothing past the lake's watermarks, else the cause."""
    from kafka import TopicPartition
    from kafka.errors import KafkaError

    tps = {p: TopicPartition(topic, p) for p in resume}
    try:
        end = consumer.end_offsets(list(tps.values()))
        log_end = {p: read_log_end(consumer, tp, end[tp]) for p, tp in tps.items()}
    except KafkaError as e:
        raise IngestError(f"consumed nothing in {seconds:.0f} s: Kafka stopped answering "
                          f"({type(e).__name__}: {e})") from None
    past = {p: (resume[p] - 1, log_end[p]) for p in tps if log_end[p] < resume[p]}
    if past:
        raise IngestError(f"the lake's watermarks are past the end of Kafka's log (partition: (watermark, log end) "
                          f"{past}): the topic was deleted and created again under the same id, or truncated; "
                          "its events would be skipped as landed, so none is. Recreate the topic (a new topic id "
                          "starts new watermarks) or point ingest at a new lake")
    waiting = {p: log_end[p] - resume[p] for p in tps if log_end[p] > resume[p]}
    if waiting:
        raise IngestError(f"consumed nothing in {seconds:.0f} s while Kafka holds {sum(waiting.values())} events "
                          f"past the lake's watermarks (partition: events {waiting}): the broker returned no "
                          "records for the assigned partitions (see its log); nothing was landed or skipped")
