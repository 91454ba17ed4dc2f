"""Asynchronous trace emission: user requests never wait on Kafka.

``emit(event)`` only puts a dict on a bounded in-memory queue (microseconds). A background
thread drains the queue in batches through :class:`TraceProducer` and waits for delivery
with a short timeout. When Kafka is slow or down:

- the queue is full      -> the event goes to the spill file instead (counted ``spilled_full``;
                            the request waits for that write, as below, never for Kafka);
- a batch is not delivered -> the failed events go to the spill file (``spilled_failed``);
- the producer cannot be created (no broker) -> the batch is spilled, retried after a backoff.

Spill files are JSON lines under ``<spill_dir>``: the thread writes the open segment
``spill-<pid>-<n>.jsonl``; every ``replay_interval_s`` while Kafka answers it closes the
segment and sends the closed ones again, deleting each file only once all of its events
were delivered (``replayed``). Duplicate deliveries are harmless: ingest drops repeated
``event_id``s. An event the contract validator rejects is never retried: it goes to
``rejected.jsonl`` with its reason (``rejected``). Every count is in :meth:`stats`.

The emitter survives its own disk and its own bugs: a spill or journal line that does not
parse (a crash tore it mid-write, the disk garbled it) is moved to ``corrupt.jsonl`` with its
file and line number (``corrupt_lines``) and the rest is replayed; any exception in the thread
spills the batch it held, and the thread starts again after a backoff (``restarts``), so the
gateway never answers 200 over a dead emitter. :meth:`health` says which state it is in.

On the embedded broker (in memory), every delivered event is also kept in a journal until the
lake holds it, and re-sent if the broker restarted before ingest read it: see ``journal.py``.

While Kafka is down, nothing is answered from memory alone (issue #40). ``emit`` returns None while
Kafka is up (the event is queued, as above: no disk, no wait), and otherwise a future that is done
once the event is written to the open spill segment and fsync'd; the gateway answers after it. One
writer thread (``tracerl-spill``) does a group commit: it appends every event waiting, fsyncs once
and completes all their futures, so concurrent requests share one fsync (counted ``commits``; the
events are ``spilled_failed``). Kafka counts as down (``health()["kafka_down"]``, counted
``outages``) from the first of:

- the producer has no open connection left (a broker that stops or dies closes its sockets and
  the producer sees the EOF within milliseconds; checked in ``emit`` and every ``watch_s``);
- a call to Kafka (a batch's delivery, a replay, creating the producer) pending ``durable_after_s``
  (a broker that hangs, a network that drops packets without a reset);
- a failed delivery.

At that moment the writer also takes what memory holds to disk in one fsync: the queue, and a copy
of the batch being sent (its delivery may still succeed: those events are then sent twice, and
ingest drops the repeated ``event_id``). Kafka counts as up again once a replay of the spill and a
metadata request both succeeded; events go to the queue again from then on.

The window left (docs/scale-out.md): an answered event is only in memory until Kafka acknowledges
it or the switch to "down" puts it on disk (within ``watch_s`` and one fsync); a kill -9 inside
that span loses it. Kafka up, the span is ``linger_s`` (0.1 s) plus a produce round trip, as
before. Kafka going away, the switch comes milliseconds after the broker's sockets close, or
``durable_after_s`` + ``watch_s`` into a call that hangs; a gateway that starts while Kafka is down
counts it as up until the first signal. The thread restarting after its own crash (``restarts``)
is not an outage: its queue stays in memory until it runs again.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from pipelines.faults import fault

if TYPE_CHECKING:
    from pipelines.config import TracerlConfig
    from pipelines.deploy.journal import Resend


@dataclass
class EmitterConfig:
    queue_size: int = 10_000          # events held in memory before spilling to disk
    batch_size: int = 500             # events per producer flush
    linger_s: float = 0.1             # after a batch's first event, wait this long for more: one
                                      # produce request (and its wake-ups) per 0.1 s, not per request
    delivery_timeout_s: float = 5.0   # a batch not acked within this is spilled
    replay_interval_s: float = 5.0    # how often spilled events are retried
    retry_backoff_s: float = 2.0      # after a failure, wait this long before using Kafka again
    restart_backoff_s: float = 1.0    # the thread died: first wait before it starts again (doubles)
    restart_backoff_max_s: float = 30.0
    journal: bool | None = None       # keep delivered events until the lake holds them; None = on
                                      # for the embedded (in-memory) broker only
    journal_sweep_s: float = 30.0     # how often the journal is compared with the lake
    journal_max_bytes: int = 1 << 30  # past this the oldest journal segments are dropped (counted)
    durable_when_down: bool = True    # Kafka down: emit's future is done once the event is on disk
                                      # (fsync'd), and the gateway answers after it
    durable_after_s: float = 1.0      # a Kafka call pending this long counts as Kafka down (a healthy
                                      # broker answers in milliseconds; a false alarm costs only fsyncs)
    watch_s: float = 0.05             # how often the writer checks the connection and pending calls
    fsync: bool = True                # spill writes are fsync'd: they survive a power cut, not just a kill


class Emitter:
    def __init__(self, cfg: TracerlConfig, spill_dir: Path, config: EmitterConfig | None = None,
                 **producer_options: Any):
        self.cfg, self.conf = cfg, config or EmitterConfig()
        self.spill_dir = Path(spill_dir)
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        self._options = dict(max_block_ms=2000, request_timeout_ms=2000, bootstrap_timeout_ms=2000,
                             delivery_timeout_ms=int(self.conf.delivery_timeout_s * 1000),
                             reconnect_backoff_max_ms=500)
        self._options.update(producer_options)
        self._queue: queue.Queue[dict] = queue.Queue(maxsize=self.conf.queue_size)
        self._spill_lock = threading.Lock()
        # start time in the name: a restarted process (same PID in a container) never appends
        # to a file whose last line a crash tore, and names sort oldest first
        self._spill_name = f"spill-{int(time.time()):010d}-{os.getpid()}-"
        self._segment = 0
        self._counts = {k: 0 for k in ("emitted", "sent", "spilled_full", "spilled_failed", "replayed",
                                       "rejected", "kafka_errors", "corrupt_lines", "restarts",
                                       "journaled", "resent", "outages", "commits")}
        self._count_lock = threading.Lock()
        self._producer = None
        self._conns: dict | None = None  # the producer's connections, once one delivery proved them
        self._down_until = 0.0
        self._outage = False  # Kafka down or not known up: events go to disk before they are answered
        self.outage_reason: str | None = None
        self._kafka_since: float | None = None  # when the pending call to Kafka started
        self._inflight: list[dict] = []  # taken from the queue, not yet delivered or spilled
        self._inflight_lock = threading.Lock()
        self._on_disk: set[int] = set()  # ids of in-flight events the writer already put on disk
        self._commit: list[tuple[dict, Future]] = []  # waiting for the writer's next group commit
        self._commit_lock = threading.Lock()
        self._group_lock = threading.Lock()
        self._unwritten: list[dict] = []  # taken from memory, their write failed: the next group retries
        self.last_error: str | None = None
        self._state = "running"
        self.journal = None
        self._journal_size: dict[str, Any] = {}
        if self.conf.journal if self.conf.journal is not None else cfg.kafka.embedded:
            from pipelines.deploy.journal import Journal

            self.journal = Journal(self.spill_dir / "journal", cfg.table_store, self.conf.journal_max_bytes,
                                   self._corrupt)
            self._journal_size = self.journal.size()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="tracerl-emitter", daemon=True)
        self._thread.start()
        self._wake, self._writer_stop = threading.Event(), threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="tracerl-spill", daemon=True)
        self._writer.start()

    # -- caller side (the gateway's event loop) -----------------------------------------------

    def emit(self, event: dict[str, Any]) -> Future | None:
        """Hand over one event (a contract dict); never blocks, never waits on Kafka.

        None: Kafka is up and the event is queued for it. A future: Kafka is down (or not known up)
        or the queue is full, so the event goes to disk first; the future is done once it is written
        and fsync'd (or fails with what stopped the write). Answer only once it is done."""
        self._count("emitted")
        durable = self.conf.durable_when_down
        if durable and (self._outage or not self._link_up()):
            if not self._outage:
                self._enter_outage("connection to Kafka lost")
            return self._to_disk(event, "spilled_failed")
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            if durable:
                return self._to_disk(event, "spilled_full")
            self._spill([event], "spilled_full")
        return None

    def stats(self) -> dict[str, int]:
        with self._count_lock:
            out = dict(self._counts)
        out["queued"] = self._queue.qsize()
        out["spill_files"] = len(self._spill_files())
        return out

    def health(self) -> dict[str, Any]:
        """What `/health` reports: the thread's state ("running", "restarting" after a crash,
        "dead" if the thread is gone while it should run, "stopped" after close), restarts,
        queue depth, spill and journal size, lines moved aside, the last error."""
        files = self._spill_files()
        alive = self._thread.is_alive()
        state = self._state if alive else ("stopped" if self._stop.is_set() else "dead")
        with self._count_lock:
            restarts, corrupt = self._counts["restarts"], self._counts["corrupt_lines"]
        return {"state": state, "restarts": restarts, "queued": self._queue.qsize(), "spill_files": len(files),
                "spill_bytes": sum(_size(f) for f in files), "corrupt_lines": corrupt,
                "kafka_down": self._outage, "last_error": self.last_error, **self._journal_size}

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (or spill it), stop the threads, close the producer."""
        self._stop.set()
        self._thread.join(timeout)
        rest = self._take([], 10 ** 9, wait=0)
        if rest:
            self._spill(rest, "spilled_failed")
        self._writer_stop.set()
        self._wake.set()
        self._writer.join(timeout)
        self._commit_group()  # what was handed over after the writer's last group
        self._drop_producer()

    # -- Kafka down: to disk before the answer --------------------------------------------------

    def _link_up(self) -> bool:
        """False once the producer has no open connection: a broker that stopped or died closed
        its sockets. (kafka-python also closes a connection idle for 9 minutes: then the next
        requests wait for an fsync until the recovery's metadata request, milliseconds.)
        kafka-python 3 internals, read defensively: unknown reads as up (the other signals, a
        pending call and a failed delivery, still apply)."""
        conns = self._conns
        if conns is None:
            return True
        try:
            return any(c.connected for c in list(conns.values()))
        except Exception:  # noqa: BLE001 - a kafka-python that changed shape: fall back to the others
            return True

    def _note_link(self) -> None:
        """A call to Kafka succeeded: from now on a producer without connections means Kafka is gone."""
        if self._conns is None and self._producer is not None:
            self._conns = getattr(getattr(getattr(getattr(self._producer._producer, "_sender", None), "_client", None),
                                          "_manager", None), "_conns", None)

    @contextmanager
    def _calling_kafka(self) -> Iterator[None]:
        """Mark a call to Kafka as pending: the writer counts Kafka down if it lasts ``durable_after_s``."""
        before, self._kafka_since = self._kafka_since, self._kafka_since or time.monotonic()
        try:
            yield
        finally:
            self._kafka_since = before

    def _enter_outage(self, reason: str) -> None:
        if not self.conf.durable_when_down:
            return
        with self._count_lock:
            if not self._outage:
                self._outage = True
                self._counts["outages"] += 1
                self.outage_reason = reason[:500]
        self._wake.set()  # the writer takes what memory holds to disk now

    def _to_disk(self, event: dict[str, Any], counter: str) -> Future:
        done: Future = Future()
        self._count(counter)
        with self._commit_lock:
            self._commit.append((event, done))
        if self._writer_stop.is_set():
            self._commit_group()  # closed: nobody else will write it
        else:
            self._wake.set()
        return done

    def _write_loop(self) -> None:
        """The writer: watch Kafka, group-commit what waits for disk (one fsync for all of it)."""
        while not self._writer_stop.is_set():
            self._wake.wait(self.conf.watch_s)
            self._wake.clear()
            self._watch()
            self._commit_group()
        self._commit_group()

    def _watch(self) -> None:
        if self._outage or not self.conf.durable_when_down:
            return
        since = self._kafka_since
        if since is not None and time.monotonic() - since >= self.conf.durable_after_s:
            self._enter_outage(f"no answer from Kafka in {self.conf.durable_after_s:g} s")
        elif not self._link_up():
            self._enter_outage("connection to Kafka lost")

    def _commit_group(self) -> None:
        """Write every event handed over, and while Kafka is down what memory holds, with one fsync;
        then complete the futures. A future cancelled meanwhile (the client went away) is skipped;
        its event is written all the same, it was answered."""
        with self._group_lock:
            with self._commit_lock:
                waiting, self._commit = self._commit, []
            held, self._unwritten = self._unwritten + (self._held_in_memory() if self._outage else []), []
            if not waiting and not held:
                return
            live = [done for _, done in waiting if done.set_running_or_notify_cancel()]
            try:
                self._spill(held + [e for e, _ in waiting])
            except Exception as err:  # noqa: BLE001 - e.g. the disk is full: those requests fail, held events wait
                self._unwritten = held
                self.last_error = f"spill writer: {type(err).__name__}: {err}"[:500]
                for done in live:
                    done.set_exception(err)
                return
            self._count("spilled_failed", len(held))
            self._count("commits")
            for done in live:
                done.set_result(None)

    def _held_in_memory(self) -> list[dict]:
        """What memory holds for Kafka: the queue (taken), and the batch being sent (copied: its
        delivery may still succeed; the thread spills only what the writer has not)."""
        held: list[dict] = []
        try:
            while True:
                held.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        with self._inflight_lock:
            for e in list(self._inflight):
                if id(e) not in self._on_disk:
                    self._on_disk.add(id(e))
                    held.append(e)
        return held

    def _batch_done(self, failed: list[dict]) -> list[dict]:
        """The in-flight batch is over: of its undelivered events, those the writer has not put on disk."""
        with self._inflight_lock:
            failed = [e for e in failed if id(e) not in self._on_disk]
            self._on_disk.clear()
            self._inflight = []
        return failed

    def _recover(self) -> None:
        """Kafka is down: is it back? Yes once a metadata request answers and the spill replays
        (asked first: a replay that cannot succeed would still close a segment each time)."""
        if self._producer is not None and not self._link_up():
            self._drop_producer()  # its broker is gone; one that comes back is new (idempotence state)
        with self._count_lock:
            errors = self._counts["kafka_errors"]
        if self._topic_ids() is not None:
            self.replay()
            if self._counts["kafka_errors"] == errors:
                self._note_link()
                if self._link_up():
                    self._outage = False
                    return
        self._down_until = max(self._down_until, time.monotonic() + self.conf.retry_backoff_s)

    # -- the background thread ----------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._count_lock:
            self._counts[key] += n

    def _take(self, batch: list[dict], n: int, wait: float, linger: float = 0.0) -> list[dict]:
        """Move up to ``n`` events from the queue into ``batch`` (the in-flight list the writer may copy)."""
        try:
            batch.append(self._queue.get(timeout=wait) if wait else self._queue.get_nowait())
            if linger and self._queue.qsize() < n:
                self._stop.wait(linger)  # close() cuts it short
            while len(batch) < n:
                batch.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return batch

    def _supervise(self) -> None:
        """Run the loop; if it raises, keep its batch on disk and run it again after a backoff."""
        delay = self.conf.restart_backoff_s
        while True:
            started = time.monotonic()
            try:
                self._run()
                return
            except Exception as err:  # noqa: BLE001 - whatever it was, the emitter must go on
                self._count("restarts")
                self.last_error = f"emitter thread: {type(err).__name__}: {err}"[:500]
                self._state = "restarting"
                held = self._batch_done(list(self._inflight))
                try:
                    if held:
                        self._spill(held, "spilled_failed")
                    self._drop_producer()
                except Exception as again:  # noqa: BLE001 - e.g. the disk is full: noted, the loop goes on
                    self.last_error += f"; while recovering: {type(again).__name__}: {again}"[:300]
                if time.monotonic() - started > 10 * self.conf.restart_backoff_max_s:
                    delay = self.conf.restart_backoff_s  # it ran well for a while: start over
                if self._stop.wait(delay):
                    return
                delay = min(2 * delay, self.conf.restart_backoff_max_s)
                self._state = "running"

    def _run(self) -> None:
        next_replay = time.monotonic() + self.conf.replay_interval_s
        next_sweep = time.monotonic() + min(1.0, self.conf.journal_sweep_s)  # soon: a restart may have lost events
        if self.conf.durable_when_down and self._conns is None and self._topic_ids() is not None:
            self._note_link()  # connected before the first event: a broker lost from now on is seen at once
        while not self._stop.is_set():
            if self._outage:  # the writer owns the queue now; see whether Kafka is back
                if time.monotonic() >= self._down_until:
                    self._recover()
                else:
                    self._stop.wait(min(0.2, self._down_until - time.monotonic()))
            else:
                batch = self._inflight = []
                self._take(batch, self.conf.batch_size, wait=0.2, linger=self.conf.linger_s)
                fault("emitter.batch")
                self._send_or_spill(batch)
            now = time.monotonic()
            if now >= next_replay:
                next_replay = now + self.conf.replay_interval_s
                if not self._outage and self._queue.qsize() < self.conf.batch_size and now >= self._down_until:
                    self.replay()
            if self.journal is not None and now >= next_sweep:
                next_sweep = now + self.conf.journal_sweep_s
                self.sweep_journal()
        batch = self._inflight = []
        self._take(batch, 10 ** 9, wait=0)  # stopping: one last try, then spill
        self._send_or_spill(batch)

    def _send_or_spill(self, batch: list[dict]) -> None:
        failed = self._batch_done(self._deliver(batch) if batch else [])
        if failed:
            self._spill(failed, "spilled_failed")

    def _get_producer(self):
        if self._producer is None:
            from pipelines.ingest.producer import TraceProducer

            self._producer = TraceProducer(self.cfg, **self._options)
        return self._producer

    def _valid(self, events: list[dict]) -> list[tuple[dict, bytes, bytes]]:
        """(event, key, value) for the events the contract accepts; the others are rejected."""
        from pipelines.contract.validate import ValidationError
        from pipelines.ingest.producer import encode

        out = []
        for e in events:
            try:
                key, value, _ = encode(e)
                if len(value) > self.cfg.ingest.max_event_bytes:
                    raise ValidationError("oversize", f"{len(value)} bytes > ingest.max_event_bytes")
                out.append((e, key, value))
            except Exception as err:  # noqa: BLE001 - any event the contract cannot encode is rejected
                self._reject(e, f"{type(err).__name__}: {err}")
        return out

    def _deliver(self, events: list[dict], counter: str = "sent") -> list[dict]:
        """Send ``events``; return those not delivered (rejected ones are recorded, not returned).

        Delivered events are added to ``counter`` ("sent", or "replayed" for spilled ones).
        """
        from pipelines.ingest.producer import DeliveryError

        good = self._valid(events)
        if not good or time.monotonic() < self._down_until:
            return [e for e, _, _ in good]
        by_id = {e["event_id"]: e for e, _, _ in good}
        sent: list[tuple[Any, bytes]] = []
        cluster = None
        try:
            with self._calling_kafka():
                producer = self._get_producer()
                cluster = producer._producer._metadata  # kept: a failure below drops the producer
                for e, key, value in good:
                    sent.append((producer.send_raw(key, value, e["event_id"]), value))
                producer.flush(timeout=self.conf.delivery_timeout_s)
            self._count(counter, len(good))
            self._note_link()
            return []
        except DeliveryError as err:
            self._kafka_down(err)
            failed = [by_id[label] for label, _ in err.failures if label in by_id]
            self._count(counter, len(good) - len(failed))
            return failed
        except Exception as err:  # noqa: BLE001 - no broker, metadata or flush timeout: all waits on disk
            self._kafka_down(err)
            return list(by_id.values())
        finally:
            self._journal_delivered(sent, cluster)

    def _journal_delivered(self, sent: list[tuple[Any, bytes]], cluster: Any) -> None:
        """Journal the events Kafka acknowledged, with the coordinates it gave them."""
        if self.journal is None or not sent:
            return
        ids: dict[str, str] = {}
        rows = []
        for future, value in sent:
            if future.succeeded():
                md = future.value
                if md.topic not in ids:
                    tid = cluster.topic_id(md.topic)
                    ids[md.topic] = str(tid) if tid else ""
                rows.append((md.topic, ids[md.topic], md.partition, md.offset, value))
        self.journal.append(rows)
        self._count("journaled", len(rows))
        self._journal_size = self.journal.size()

    def sweep_journal(self) -> int:
        """Delete what the lake holds; re-send what a restarted broker lost. Returns how many were re-sent."""
        assert self.journal is not None
        resend = self.journal.sweep(self._topic_ids() if time.monotonic() >= self._down_until else None)
        done = 0
        for item in resend:
            if not self._resend(item):
                break
            done += len(item.events)
        self._journal_size = self.journal.size()
        return done

    def _resend(self, item: Resend) -> bool:
        for start in range(0, len(item.events), self.conf.batch_size):
            if self._deliver(item.events[start:start + self.conf.batch_size], "resent"):
                return False  # Kafka is down again: the segment stays as it is, a later sweep retries
        self.journal.settle(item)
        return True

    def _topic_ids(self) -> dict[str, str] | None:
        """The broker's current id of our topic, fresh from a metadata request: {} when the broker
        answered without the topic, None when it did not answer."""
        topic = self.cfg.kafka.topic
        try:
            with self._calling_kafka():
                cluster = self._get_producer()._producer._metadata
                cluster.add_topic(topic)
                update = cluster.request_update()
                deadline = time.monotonic() + self.conf.delivery_timeout_s
                while not update.is_done and time.monotonic() < deadline:
                    time.sleep(0.02)
            if not update.succeeded():
                return None
            if cluster.partitions_for_topic(topic) is None:
                return {}
        except Exception as err:  # noqa: BLE001 - no broker: nothing is re-sent now
            self._kafka_down(err)
            return None
        tid = cluster.topic_id(topic)
        return {topic: str(tid) if tid else ""}

    def _kafka_down(self, err: BaseException) -> None:
        """Count the failure, back off, and drop the producer: a broker that comes back may be a
        new one (idempotence state, metadata), so the next attempt starts a fresh producer."""
        self._count("kafka_errors")
        self._down_until = time.monotonic() + self.conf.retry_backoff_s
        self.last_error = f"{type(err).__name__}: {err}"[:500]
        self._enter_outage(self.last_error)
        self._drop_producer()

    def _drop_producer(self) -> None:
        self._conns = None
        if self._producer is not None:
            _discard(self._producer._producer)
            self._producer = None

    def _reject(self, event: Any, reason: str) -> None:
        self._count("rejected")
        self._append("rejected.jsonl", {"reason": reason, "event": event})

    def _corrupt(self, path: Path, number: int, line: str, reason: str) -> None:
        """Move one unreadable line aside: kept for a person to look at, never replayed."""
        self._count("corrupt_lines")
        self._append("corrupt.jsonl", {"file": path.name, "line": number, "reason": reason, "text": line[:1 << 20]})

    def _append(self, name: str, record: dict) -> None:
        line = _json_line(record) or _json_line({**record, "event": _describe(record.get("event"))})
        with self._spill_lock, open(self.spill_dir / name, "a") as fh:
            fh.write(line or "{}\n")

    # -- spill files --------------------------------------------------------------------------

    def _segment_path(self) -> Path:
        return self.spill_dir / f"{self._spill_name}{self._segment:06d}.jsonl"

    def _spill_files(self) -> list[Path]:
        return sorted(self.spill_dir.glob("spill-*.jsonl"))

    def _spill(self, events: list[dict], counter: str | None = None) -> None:
        """Append to the open segment; fsync'd (``EmitterConfig.fsync``), the folder too for a new file."""
        lines = []
        for e in events:
            line = _json_line(e)
            if line is None:
                self._reject(e, "not serializable as JSON")
            else:
                lines.append(line)
        with self._spill_lock:
            path = self._segment_path()
            new = not path.exists()
            with open(path, "a") as fh:
                fh.write("".join(lines))
                if self.conf.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            if new and self.conf.fsync:
                _fsync_dir(self.spill_dir)
        if counter:
            self._count(counter, len(lines))

    def _read_spill(self, path: Path) -> list[dict]:
        """The events of a spill file; a line that is not one JSON object is moved aside."""
        events, bad = [], False
        for number, line in enumerate(path.read_text(errors="surrogateescape").splitlines(), 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError(f"a JSON {type(event).__name__}, not an event object")
                events.append(event)
            except (ValueError, RecursionError) as err:
                self._corrupt(path, number, line.encode(errors="surrogateescape").decode(errors="replace"),
                              f"spill: {type(err).__name__}: {err}"[:300])
                bad = True
        if bad:
            self._rewrite_spill(path, events)
        return events

    @staticmethod
    def _rewrite_spill(path: Path, events: list[dict]) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(_json_line(e) or "" for e in events))
        os.replace(tmp, path)

    def replay(self) -> int:
        """Send spilled events again, oldest file first; return how many were delivered.

        Only the background thread calls this (or a test, after ``close``). A file is deleted
        only when every event in it was delivered; a failure stops the replay for now.
        """
        with self._spill_lock:
            if self._segment_path().exists():
                self._segment += 1  # close the open segment: new spills go to a new file
            files = self._spill_files()
        done = 0
        for path in files:
            events = self._read_spill(path)
            for start in range(0, len(events), self.conf.batch_size):
                chunk = events[start:start + self.conf.batch_size]
                failed = self._deliver(chunk, "replayed")
                if failed:  # keep what is left of this file, try again later
                    self._rewrite_spill(path, failed + events[start + len(chunk):])
                    return done + len(chunk) - len(failed)
                done += len(chunk)
            path.unlink()
        return done


def _json_line(obj: Any) -> str | None:
    """One JSON line (ASCII: a lone surrogate is escaped, never written raw), or None."""
    try:
        return json.dumps(obj, default=str) + "\n"
    except (ValueError, TypeError, RecursionError):
        return None


def _describe(value: Any) -> str:
    """A bounded repr for an event JSON cannot write (too deep, not serializable)."""
    try:
        return repr(value)[:1 << 16]
    except Exception:  # noqa: BLE001 - RecursionError and whatever a foreign __repr__ raises
        return f"<unprintable {type(value).__name__}>"


def _fsync_dir(path: Path) -> None:
    """A new file's name is durable once its folder is fsync'd (POSIX); not on every platform."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _discard(producer: Any) -> None:
    """Close a kafka-python producer whose sends may never complete (broker gone).

    ``KafkaProducer.close`` flushes first and raises on timeout before it stops its sender
    thread (kafka-python 3.0), leaking the thread; force-closing the sender first aborts the
    pending batches (their futures fail: those events are already spilled), then close is quick.
    """
    try:
        if getattr(producer, "_sender", None) is not None:
            producer._sender.force_close()
            producer._sender.join(5)
        producer.close(timeout=1)
    except Exception:  # noqa: BLE001 - best effort on a dead connection; nothing left to deliver
        pass
