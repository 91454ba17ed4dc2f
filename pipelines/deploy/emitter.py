"""Asynchronous trace emission: user requests never wait on Kafka.

``emit(event)`` only puts a dict on a bounded in-memory queue (microseconds). A background
thread drains the queue in batches through :class:`TraceProducer` and waits for delivery
with a short timeout. When Kafka is slow or down:

- the queue is full      -> ``emit`` appends the event to the spill file instead (counted
                            ``spilled_full``); the request still does not wait on Kafka;
- a batch is not delivered -> the failed events go to the spill file (``spilled_failed``);
- the producer cannot be created (no broker) -> the batch is spilled, retried after a backoff.

Spill files are JSON lines under ``<spill_dir>``: the thread writes the open segment
``spill-<pid>-<n>.jsonl``; every ``replay_interval_s`` while Kafka answers it closes the
segment and sends the closed ones again, deleting each file only once all of its events
were delivered (``replayed``). Duplicate deliveries are harmless: ingest drops repeated
``event_id``s. An event the contract validator rejects is never retried: it goes to
``rejected.jsonl`` with its reason (``rejected``). Every count is in :meth:`stats`.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipelines.config import TracerlConfig


@dataclass
class EmitterConfig:
    queue_size: int = 10_000          # events held in memory before spilling to disk
    batch_size: int = 500             # events per producer flush
    delivery_timeout_s: float = 5.0   # a batch not acked within this is spilled
    replay_interval_s: float = 5.0    # how often spilled events are retried
    retry_backoff_s: float = 2.0      # after a failure, wait this long before using Kafka again


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
        self._segment = 0
        self._counts = {k: 0 for k in ("emitted", "sent", "spilled_full", "spilled_failed", "replayed",
                                       "rejected", "kafka_errors")}
        self._count_lock = threading.Lock()
        self._producer = None
        self._down_until = 0.0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tracerl-emitter", daemon=True)
        self._thread.start()

    # -- caller side (the gateway's event loop) -----------------------------------------------

    def emit(self, event: dict[str, Any]) -> None:
        """Queue one event (a contract dict); never blocks on Kafka."""
        self._count("emitted")
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._spill([event], "spilled_full")

    def stats(self) -> dict[str, int]:
        with self._count_lock:
            out = dict(self._counts)
        out["queued"] = self._queue.qsize()
        out["spill_files"] = len(list(self.spill_dir.glob("spill-*.jsonl")))
        return out

    def health(self) -> dict[str, Any]:
        """What `/health` reports: the thread's state, queue depth, spill size, last error."""
        files = list(self.spill_dir.glob("spill-*.jsonl"))
        return {"state": "running" if self._thread.is_alive() else "dead",
                "queued": self._queue.qsize(), "spill_files": len(files),
                "spill_bytes": sum(f.stat().st_size for f in files if f.exists()),
                "last_error": self.last_error}

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (or spill it), stop the thread, close the producer."""
        self._stop.set()
        self._thread.join(timeout)
        rest = self._take(10 ** 9, wait=0)
        if rest:
            self._spill(rest, "spilled_failed")
        if self._producer is not None:
            _discard(self._producer._producer)
            self._producer = None

    # -- the background thread ----------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._count_lock:
            self._counts[key] += n

    def _take(self, n: int, wait: float) -> list[dict]:
        batch: list[dict] = []
        try:
            batch.append(self._queue.get(timeout=wait) if wait else self._queue.get_nowait())
            while len(batch) < n:
                batch.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return batch

    def _run(self) -> None:
        next_replay = time.monotonic() + self.conf.replay_interval_s
        while not self._stop.is_set():
            batch = self._take(self.conf.batch_size, wait=0.2)
            if batch:
                failed = self._deliver(batch)
                if failed:
                    self._spill(failed, "spilled_failed")
            if time.monotonic() >= next_replay:
                next_replay = time.monotonic() + self.conf.replay_interval_s
                if self._queue.qsize() < self.conf.batch_size and time.monotonic() >= self._down_until:
                    self.replay()
        batch = self._take(10 ** 9, wait=0)  # stopping: one last try, then spill
        if batch:
            failed = self._deliver(batch)
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
            except (ValidationError, KeyError, TypeError, ValueError) as err:
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
        try:
            producer = self._get_producer()
            for e, key, value in good:
                producer.send_raw(key, value, e["event_id"])
            producer.flush(timeout=self.conf.delivery_timeout_s)
            self._count(counter, len(good))
            return []
        except DeliveryError as err:
            self._kafka_down(err)
            failed = [by_id[label] for label, _ in err.failures if label in by_id]
            self._count(counter, len(good) - len(failed))
            return failed
        except Exception as err:  # noqa: BLE001 - no broker, metadata or flush timeout: all waits on disk
            self._kafka_down(err)
            return list(by_id.values())

    def _kafka_down(self, err: BaseException) -> None:
        """Count the failure, back off, and drop the producer: a broker that comes back may be a
        new one (idempotence state, metadata), so the next attempt starts a fresh producer."""
        self._count("kafka_errors")
        self._down_until = time.monotonic() + self.conf.retry_backoff_s
        self.last_error = f"{type(err).__name__}: {err}"[:500]
        if self._producer is not None:
            _discard(self._producer._producer)
            self._producer = None

    def _reject(self, event: dict, reason: str) -> None:
        self._count("rejected")
        with self._spill_lock, open(self.spill_dir / "rejected.jsonl", "a") as fh:
            fh.write(json.dumps({"reason": reason, "event": event}, default=str) + "\n")

    # -- spill files --------------------------------------------------------------------------

    def _segment_path(self) -> Path:
        return self.spill_dir / f"spill-{os.getpid()}-{self._segment:06d}.jsonl"

    def _spill(self, events: list[dict], counter: str) -> None:
        with self._spill_lock, open(self._segment_path(), "a") as fh:
            fh.write("".join(json.dumps(e, default=str) + "\n" for e in events))
        self._count(counter, len(events))

    def replay(self) -> int:
        """Send spilled events again, oldest file first; return how many were delivered.

        Only the background thread calls this (or a test, after ``close``). A file is deleted
        only when every event in it was delivered; a failure stops the replay for now.
        """
        with self._spill_lock:
            if self._segment_path().exists():
                self._segment += 1  # close the open segment: new spills go to a new file
            files = sorted(self.spill_dir.glob("spill-*.jsonl"))
        done = 0
        for path in files:
            events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for start in range(0, len(events), self.conf.batch_size):
                chunk = events[start:start + self.conf.batch_size]
                failed = self._deliver(chunk, "replayed")
                if failed:  # keep what is left of this file, try again later
                    rest = failed + events[start + len(chunk):]
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text("".join(json.dumps(e) + "\n" for e in rest))
                    os.replace(tmp, path)
                    return done + len(chunk) - len(failed)
                done += len(chunk)
            path.unlink()
        return done


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
