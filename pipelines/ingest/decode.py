"""Raw Kafka records -> Arrow tables of events and quarantined messages.

JSON decoding, validation and building columns are ~85% of ingest's CPU time
and hold the GIL. So each polled chunk goes to a worker process, which returns
finished Arrow tables, while the main process keeps fetching from Kafka: the
two cores overlap instead of taking turns. Small chunks (tests, a quiet topic)
are decoded inline and never start a process. Both paths run `decode_chunk`.

An event's `user` that is not a pseudonym already (a direct producer's own id: the gateway sends
pseudonyms) is replaced by the tenant's pseudonym (`pipelines.privacy.pseudonym`) in the stored
payload and the `user_id` column, so the lake never holds a user id in clear (docs/privacy.md).
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
import os
import signal
import sys
from concurrent.futures import Future, ProcessPoolExecutor, TimeoutError
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.contract.validate import (
    FIELDS, INTERNAL_ERROR, ValidationError, check_topic_tenant, decode_message, parse_time,
)
from pipelines.lake.tables import EVENTS_SCHEMA, HOT_COLUMNS, QUARANTINE_SCHEMA
from pipelines.privacy.pseudonym import is_pseudonym, pseudonym

# Columns carried beside the stored schema until landing: hive partition keys, the payload to
# store where ingest changed the message (a user id pseudonymized; NULL: the bytes as sent), and
# the record's position in the batch (to apply the main process's filters).
ROUTING = [("tenant", pa.string()), ("day", pa.string()), ("rewritten", pa.string()), ("row", pa.int64())]
EVENTS_WITH_ROUTING = pa.schema(list(EVENTS_SCHEMA) + [pa.field(n, t) for n, t in ROUTING])
# What `Decoder` returns: the raw bytes stay out. The poller holds them, and ingest adds each
# partition's as it stages it (`with_payload`): sending ~1 KB an event back from a worker, and
# copying it again to split the batch by partition, cost more CPU than the decode saved.
PAYLOAD = EVENTS_WITH_ROUTING.get_field_index("payload")
EVENTS_DECODED = EVENTS_WITH_ROUTING.remove(PAYLOAD)
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


def last_user_text(messages) -> str | None:
    """The content of the last `user` message of a validated `input_messages` (None: none, or not text)."""
    for m in reversed(messages):
        if type(m) is dict and m.get("role") == "user":
            c = m.get("content")
            return c if type(c) is str else None
    return None


def hot_fields(e: dict) -> tuple:
    """The hot columns of one *validated* event, in `tables.HOT_COLUMNS` order (its `user` must be
    a pseudonym by now: `pseudonymize`).

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
                ms if type(ms) is float else _f64(ms), g("output_text"), last_user_text(g("input_messages") or ()),
                g("user"))
    if t == "feedback":
        return (g("kind"), _f64(g("value")), _f64(g("scale_min")), _f64(g("scale_max")), g("sentiment"),
                None, None, None, None, None, None, None, g("user"))
    if t == "tool_call":
        a, ms = g("attempt"), g("latency_ms")
        if a is not None and not _I32_MIN <= a <= _I32_MAX:
            a = None
        return (g("outcome"), None, None, None, None, None, g("call_id"), a, None,
                ms if type(ms) is float else _f64(ms), None, None, g("user"))
    if t == "session_end":
        return (g("outcome"), None, None, None, None, g("task_success"), None, None, None, None, None, None,
                g("user"))
    return (None,) * len(HOT_COLUMNS)


def pseudonymize(e: dict, value: bytes, home: str | None) -> str | None:
    """Replace a validated event's clear `user` by the tenant's pseudonym: in ``e`` (the hot
    column) and in the payload to store, which this returns (None: nothing to change, the bytes
    as sent are stored). The payload is the message as sent, parsed again and written back with
    only `user` changed (key order kept)."""
    user = e.get("user")
    if user is None or is_pseudonym(user):
        return None
    if home is None:
        raise RuntimeError("ingest has no home folder for the tenants' secrets: a clear user id cannot be "
                           "pseudonymized, so it is not landed")
    e["user"] = pseudonym(home, e["tenant"], user)
    obj = json.loads(bytes(value).decode("utf-8"))  # accepted by decode_message: strict UTF-8, unique keys
    obj["user"] = e["user"]
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def decode_chunk(chunk: Chunk, max_bytes: int, run_id: str, now_ms: int,
                 topic_tenants: dict[str, str] | None = None, payload: bool = True,
                 home: str | None = None) -> tuple[pa.Table, pa.Table]:
    """A chunk as (events, quarantine) tables; never raises, every message lands in one of them.
    Without `payload`, the events table leaves its payload column out (`Decoder` does: see `PAYLOAD`).
    ``home``: where the tenants' pseudonym secrets are (`pseudonymize`; None: an event with a
    clear user id is quarantined as `internal_error`, never landed in clear).

    Each message is decoded on its own, and anything unexpected quarantines that message as
    `internal_error`; if the events table still cannot be built, the rows that break it are
    found by bisection and quarantined, so one message can never block the stream.
    """
    rows, bad = [], []
    topic, part, first = chunk.topic, chunk.partition, chunk.first_row
    tenants = topic_tenants or {}
    for i, value in enumerate(chunk.values):
        try:
            e = decode_message(value, max_bytes)
            if tenants:
                check_topic_tenant(e, topic, tenants)
            rewritten = pseudonymize(e, value, home)
            rows.append(_event_row(e, topic, part, chunk.offsets[i], now_ms, run_id, first + i, rewritten))
        except ValidationError as err:
            bad.append(_bad_row(chunk, i, err.reason, str(err), now_ms, run_id))
        except Exception as err:  # a bug of ours, not the producer's: keep the bytes, keep going
            bad.append(_internal_row(chunk, i, "decode failed", err, now_ms, run_id))
    events, broken = _build(rows, EVENTS_DECODED)
    for row, err in broken:
        bad.append(_internal_row(chunk, row[-1] - first, "building the events table failed", err, now_ms, run_id))
    bad.sort(key=lambda r: r[-1])
    if payload:
        events = with_payload(events, chunk.values, first)
    return events, _table(bad, QUARANTINE_WITH_ROUTING)


def with_payload(events: pa.Table, values: list, first_row: int = 0) -> pa.Table:
    """`events` (without their payload) with the raw message of each row as its payload column
    (`values[0]` is the record at `first_row`): bytes `decode_message` accepted, so strict UTF-8,
    cast to strings in one C-level, checked call; or, where ingest changed the message (its
    `rewritten` column), that."""
    raw = pa.array([bytes(values[i - first_row]) for i in events.column("row").to_pylist()], pa.binary())
    text = raw.cast(pa.string())
    rewritten = events.column("rewritten")
    if rewritten.null_count < len(rewritten):
        text = pc.coalesce(rewritten.combine_chunks(), text)
    return events.add_column(PAYLOAD, EVENTS_WITH_ROUTING.field(PAYLOAD), text)


def _event_row(e: dict, topic: str, part: int, offset: int, now_ms: int, run_id: str, row: int,
               rewritten: str | None = None) -> tuple:
    t = parse_time(e["event_time"]).astimezone(timezone.utc)
    turn_id = e.get("turn_id") if "turn_id" in FIELDS[e["type"]] else None  # an unknown field elsewhere
    return (e["event_id"], e["type"], e["schema_version"], e["app"], e.get("task"), e["trace_id"],
            turn_id, int(t.timestamp() * 1000), topic, part, offset,
            now_ms, run_id, *hot_fields(e), e["tenant"], t.date().isoformat(), rewritten, row)


_TS_MAX = 253402300799999  # 9999-12-31T23:59:59.999Z in ms: the last instant a date partition can name


def _bad_row(chunk: Chunk, i: int, reason: str, error: str, now_ms: int, run_id: str) -> tuple:
    """A quarantine row that always builds: raw bytes as sent, text made valid UTF-8, a real timestamp."""
    ts = chunk.timestamps[i]
    if type(ts) is not int or not 0 < ts <= _TS_MAX:
        ts = now_ms  # no timestamp, or a producer's CreateTime no date can hold
    value, key = chunk.values[i], chunk.keys[i]
    return (reason, error.encode("utf-8", "backslashreplace").decode(), _raw(value), _raw(key), chunk.topic,
            chunk.partition, chunk.offsets[i], ts, now_ms, run_id,
            datetime.fromtimestamp(ts / 1000, timezone.utc).date().isoformat(), chunk.first_row + i)


def _internal_row(chunk: Chunk, i: int, what: str, err: BaseException, now_ms: int, run_id: str) -> tuple:
    return _bad_row(chunk, i, INTERNAL_ERROR, f"{INTERNAL_ERROR}: {what}: {type(err).__name__}: {err}"[:2000],
                    now_ms, run_id)


def _raw(b) -> bytes | None:
    return None if b is None else bytes(b) if isinstance(b, (bytes, bytearray, memoryview)) else repr(b).encode()


def _build(rows: list[tuple], schema: pa.Schema) -> tuple[pa.Table, list[tuple[tuple, Exception]]]:
    """The table of `rows`, and the rows (with their error) that make building it fail, found by bisection."""
    try:
        return _table(rows, schema), []
    except Exception as err:
        if len(rows) == 1:
            return schema.empty_table(), [(rows[0], err)]
    mid = len(rows) // 2
    (left, lbad), (right, rbad) = _build(rows[:mid], schema), _build(rows[mid:], schema)
    return pa.concat_tables([left, right]), lbad + rbad


def _table(rows: list[tuple], schema: pa.Schema) -> pa.Table:
    cols = list(zip(*rows)) if rows else [()] * len(schema)
    arrays = []
    return pa.Table.from_arrays([pa.array(values, f.type) for f, values in zip(schema, cols)], schema=schema)


class Decoder:
    """Decodes chunks as they are polled; a worker process takes chunks >= `parallel_from`.

    `topic_tenants` maps a topic to the one tenant allowed on it (`ingest.topic_tenants`);
    events on a mapped topic that claim another tenant are quarantined as `tenant_mismatch`.

    Defence in depth: `decode_chunk` is total by design, but if a chunk still raises (inline or
    in its worker) or a worker dies (the OOM killer, a kill), the chunk is decoded again here,
    halved until each message that raises is alone; those are quarantined as `internal_error`
    with the exception, the rest lands, and `failure` says what happened (the asset check turns
    red). It costs nothing while decode succeeds. A message that crashes the interpreter itself
    (a segfault in a C extension) is not isolated.
    """

    def __init__(self, max_bytes: int, workers: int, run_id: str, now_ms: int, parallel_from: int = 2000,
                 topic_tenants: dict[str, str] | None = None, home: str | None = None):
        self.args = (max_bytes, run_id, now_ms, dict(topic_tenants or {}))
        self.home = None if home is None else str(home)  # the tenants' pseudonym secrets (`pseudonymize`)
        self.workers, self.parallel_from = workers, parallel_from
        self.failure: str | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._parts: list[tuple[Future | list[tuple[pa.Table, pa.Table]], Chunk]] = []

    def submit(self, chunk: Chunk) -> None:
        if self.failure is None and self.workers and len(chunk.values) >= self.parallel_from:
            try:
                if self._pool is None:  # spawn: never fork a process holding Kafka sockets and threads
                    self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                                     initializer=die_with_parent, initargs=(os.getpid(),))
                self._parts.append((self._pool.submit(decode_chunk, chunk, *self.args, payload=False,
                                                      home=self.home), chunk))
                return
            except Exception as err:  # a broken pool (a worker died): decode here from now on
                self._failed(err)
        self._parts.append((self._isolate(chunk), chunk))

    def results(self) -> tuple[pa.Table, pa.Table]:
        """(events without their payload column, quarantine) of every chunk submitted, in order."""
        parts = [p for part, chunk in self._parts for p in self._result(part, chunk)]
        events = pa.concat_tables([e for e, _ in parts]) if parts else EVENTS_DECODED.empty_table()
        quarantine = pa.concat_tables([q for _, q in parts]) if parts else QUARANTINE_WITH_ROUTING.empty_table()
        return events, quarantine

    def close(self) -> None:
        if self._pool is None:
            return
        if self.failure is not None:  # a broken pool can hang a waiting shutdown: kill, then don't wait
            for proc in self._workers():
                proc.kill()
            self._pool.shutdown(wait=False, cancel_futures=True)
        else:
            self._pool.shutdown(cancel_futures=True)

    def _failed(self, err: BaseException) -> None:
        if self.failure is None:
            self.failure = f"{type(err).__name__}: {err}"[:500].encode("utf-8", "backslashreplace").decode()

    def _result(self, part, chunk: Chunk) -> list[tuple[pa.Table, pa.Table]]:
        if not isinstance(part, Future):
            return part
        try:
            return [self._wait(part)]
        except Exception as err:  # the worker raised or died: decode its chunk here instead
            self._failed(err)
            return self._isolate(chunk)

    def _wait(self, future: Future) -> tuple[pa.Table, pa.Table]:
        """The future's result; a dead worker fails it even where the pool would not notice
        (CPython 3.11 can wait forever on a worker killed while it starts)."""
        while True:
            try:
                return future.result(timeout=1.0)
            except TimeoutError:
                dead = [p.pid for p in self._workers() if p.exitcode is not None]
                if dead:
                    raise BrokenProcessPool(f"decode worker {dead[0]} died") from None

    def _workers(self) -> list:
        """The pool's worker processes (a private attribute of CPython's executor, read defensively)."""
        return list((getattr(self._pool, "_processes", None) or {}).copy().values())

    def _isolate(self, chunk: Chunk) -> list[tuple[pa.Table, pa.Table]]:
        """`decode_chunk` here, halving a chunk that raises until each message that raises is alone."""
        try:
            return [decode_chunk(chunk, *self.args, payload=False, home=self.home)]
        except Exception as err:
            self._failed(err)
            n = len(chunk.values)
            if n == 1:
                _, run_id, now_ms, _ = self.args
                return [(EVENTS_DECODED.empty_table(),
                         _table([_internal_row(chunk, 0, "decode failed", err, now_ms, run_id)],
                                QUARANTINE_WITH_ROUTING))]
            return [p for lo, hi in ((0, n // 2), (n // 2, n)) for p in self._isolate(_slice(chunk, lo, hi))]


def _slice(c: Chunk, lo: int, hi: int) -> Chunk:
    return Chunk(c.topic, c.partition, c.first_row + lo, c.offsets[lo:hi], c.timestamps[lo:hi], c.keys[lo:hi],
                 c.values[lo:hi])


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """Worker initializer: the kernel SIGKILLs this worker when the process that spawned it dies,
    so a kill -9 of ingest leaves no orphan holding its pipes (and the multiprocessing resource
    tracker, which exits when the last holder of its pipe closes it, goes too). The signal follows
    the spawning *thread*: `Decoder` is used and closed within one thread (`run_ingest`)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
