"""Raw Kafka records -> Arrow tables of events and quarantined messages.

JSON decoding, validation and building columns are ~85% of ingest's CPU time
and hold the GIL. So each polled chunk goes to a worker process, which returns
finished Arrow tables, while the main process keeps fetching from Kafka: the
two cores overlap instead of taking turns. Small chunks (tests, a quiet topic)
are decoded inline and never start a process. Both paths run `decode_chunk`.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa

from pipelines.contract.validate import ValidationError, decode_message, parse_time
from pipelines.ingest.tables import EVENTS_SCHEMA, HOT_COLUMNS, QUARANTINE_SCHEMA

# Columns carried beside the stored schema until landing: hive partition keys
# and the record's position in the batch (to apply the main process's filters).
ROUTING = [("tenant", pa.string()), ("day", pa.string()), ("row", pa.int64())]
EVENTS_WITH_ROUTING = pa.schema(list(EVENTS_SCHEMA) + [pa.field(n, t) for n, t in ROUTING])
QUARANTINE_WITH_ROUTING = pa.schema(list(QUARANTINE_SCHEMA) + [pa.field("day", pa.string()), pa.field("row", pa.int64())])


@dataclass
class Chunk:
    """One partition's slice of a poll, as plain lists (cheap to send to a worker)."""

    topic: str
    partition: int
    first_row: int
    offsets: list[int]
    timestamps: list[int]
    keys: list
    values: list


_I32_MIN, _I32_MAX = -2**31, 2**31 - 1


def _f64(v):
    """A contract number as float64 (pyarrow refuses ints >= 2**63; beyond float range: NULL, as TRY_CAST)."""
    if v is None or type(v) is float:
        return v
    try:
        return float(v)
    except OverflowError:
        return None


def hot_fields(e: dict) -> tuple:
    """The hot columns of one *validated* event, in `tables.HOT_COLUMNS` order.

    Only the fields its type defines (others stay NULL); types are already
    checked by the validator, so this only copies, plus the int32/float64
    range checks a valid JSON number can still fail. The one definition:
    ingest, the reward tests' lake helper and the benchmark all call it.
    ~1 us an event: plain lookups, and a call only for a number not already a float.
    """
    t = e["type"]
    g = e.get
    if t == "model_turn":
        i, ms = e["turn_index"], g("latency_ms")
        return (None, None, None, None, None, None, None, None, i if _I32_MIN <= i <= _I32_MAX else None,
                ms if type(ms) is float else _f64(ms), g("output_text"))
    if t == "feedback":
        return (g("kind"), _f64(g("value")), _f64(g("scale_min")), _f64(g("scale_max")), g("sentiment"),
                None, None, None, None, None, None)
    if t == "tool_call":
        a, ms = g("attempt"), g("latency_ms")
        if a is not None and not _I32_MIN <= a <= _I32_MAX:
            a = None
        return (g("outcome"), None, None, None, None, None, g("call_id"), a, None,
                ms if type(ms) is float else _f64(ms), None)
    if t == "session_end":
        return (g("outcome"), None, None, None, None, g("task_success"), None, None, None, None, None)
    return (None,) * len(HOT_COLUMNS)


def decode_chunk(chunk: Chunk, max_bytes: int, run_id: str, now_ms: int) -> tuple[pa.Table, pa.Table]:
    rows, bad = [], []
    topic, part, first = chunk.topic, chunk.partition, chunk.first_row
    for i, value in enumerate(chunk.values):
        try:
            e = decode_message(value, max_bytes)
        except ValidationError as err:
            ts = chunk.timestamps[i] if chunk.timestamps[i] and chunk.timestamps[i] > 0 else now_ms
            bad.append((err.reason, str(err), value, chunk.keys[i], topic, part, chunk.offsets[i], ts, now_ms,
                        run_id, datetime.fromtimestamp(ts / 1000, timezone.utc).date().isoformat(), first + i))
            continue
        t = parse_time(e["event_time"]).astimezone(timezone.utc)
        rows.append((e["event_id"], e["type"], e["schema_version"], e["app"], e.get("task"), e["trace_id"],
                     e.get("turn_id"), int(t.timestamp() * 1000), value, topic, part, chunk.offsets[i],
                     now_ms, run_id, *hot_fields(e), e["tenant"], t.date().isoformat(), first + i))
    return _table(rows, EVENTS_WITH_ROUTING), _table(bad, QUARANTINE_WITH_ROUTING)


def _table(rows: list[tuple], schema: pa.Schema) -> pa.Table:
    cols = list(zip(*rows)) if rows else [()] * len(schema)
    arrays = []
    for f, values in zip(schema, cols):
        if f.name == "payload":  # bytes -> binary -> one C-level, UTF-8-checked cast
            arrays.append(pa.array(values, pa.binary()).cast(pa.string()))
        else:
            arrays.append(pa.array(values, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


class Decoder:
    """Decodes chunks as they are polled; a worker process takes chunks >= `parallel_from`."""

    def __init__(self, max_bytes: int, workers: int, run_id: str, now_ms: int, parallel_from: int = 2000):
        self.args = (max_bytes, run_id, now_ms)
        self.workers, self.parallel_from = workers, parallel_from
        self._pool: ProcessPoolExecutor | None = None
        self._parts: list = []

    def submit(self, chunk: Chunk) -> None:
        if self.workers and len(chunk.values) >= self.parallel_from:
            if self._pool is None:  # spawn: never fork a process holding Kafka sockets and threads
                self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
            self._parts.append(self._pool.submit(decode_chunk, chunk, *self.args))
        else:
            self._parts.append(decode_chunk(chunk, *self.args))

    def results(self) -> tuple[pa.Table, pa.Table]:
        parts = [p.result() if isinstance(p, Future) else p for p in self._parts]
        events = pa.concat_tables([e for e, _ in parts]) if parts else EVENTS_WITH_ROUTING.empty_table()
        quarantine = pa.concat_tables([q for _, q in parts]) if parts else QUARANTINE_WITH_ROUTING.empty_table()
        return events, quarantine

    def close(self) -> None:
        if self._pool:
            self._pool.shutdown(cancel_futures=True)
