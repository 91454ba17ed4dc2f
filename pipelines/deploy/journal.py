"""The gateway keeps every delivered event until the lake holds it.

Why: the embedded Tansu broker stores in memory (its shipped build has only the ``memory://``
and ``s3://`` engines), so events Kafka acknowledged but ingest had not read yet die with it, on
a planned ``tracerl down`` as on a kill -9. Rather than make the broker durable (an S3 server
beside it, every produce a network round trip to it), the one process that saw each event
keeps it: after Kafka acknowledges an event, the emitter appends it here with its Kafka
coordinates (topic, topic id, partition, offset). A sweep then compares the journal with the
lake's events table, whose commits record the last landed offset per (topic id, partition):

- a segment whose every event is at or below the lake's watermark is deleted;
- an event journaled under a topic id that is no longer the broker's (the broker restarted,
  its topic is a new log) and not covered by the lake was lost with the old broker: it is
  returned for re-sending. Ingest drops repeated ``event_id``s, so a duplicate is harmless.

A segment is a text file of lines ``topic \\t topic_id \\t partition \\t offset \\t <event JSON>``:
the coordinates are read without parsing the event, and a topic name cannot hold a tab. Lines
are flushed per batch, not fsync'd: the journal outlives the broker and the gateway process,
not a power cut of the gateway's host. The journal is bounded (``max_bytes``): past it the
oldest segments are dropped and counted, so a lake that never ingests cannot fill the disk.

This covers what goes through the gateway only; producers that write to Kafka directly
(``TraceProducer``) depend on the broker, and production belongs on a replicated cluster.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from pipelines.lake import delta
from pipelines.lake.delta import Coord


@dataclass
class Segment:
    """What a sweep needs to know about a segment without reading it: its highest offset per coordinate."""

    path: Path
    high: dict[Coord, int] = field(default_factory=dict)
    events: int = 0
    bytes: int = 0


@dataclass
class Resend:
    """Events of one segment to send again; ``keep`` are its lines still waiting for the lake."""

    path: Path
    events: list[dict]
    keep: list[str]


@dataclass
class LakeMarks:
    """Highest landed offset per (topic, topic id, partition): the events table's application
    transactions (`pipelines/lake/delta.py`), keyed by topic id, so a recreated topic's old log
    stays covered."""

    tables: delta.Where  # `TracerlConfig.table_store`

    def refresh(self, coords: Iterable[Coord]) -> dict[Coord, int]:
        return delta.landed(self.tables, set(coords))


def parse_line(line: str) -> tuple[Coord, int, str]:
    """(coordinate, offset, event JSON) of one journal line; ValueError if torn or garbled."""
    topic, tid, part, offset, event = line.split("\t", 4)
    if not event.endswith("}"):
        raise ValueError("torn line")
    return (topic, tid, int(part)), int(offset), event


class Journal:
    PREFIX = "journal-"

    def __init__(self, root: Path, tables: delta.Where, max_bytes: int,
                 on_corrupt: Callable[[Path, int, str, str], None]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.on_corrupt = on_corrupt  # (file, line number, line, reason): moved aside by the owner
        self.marks = LakeMarks(tables)
        self._name = f"{self.PREFIX}{int(time.time()):010d}-{os.getpid()}-"
        self._n = 0
        self.open = Segment(self._path())
        self.closed: dict[Path, Segment] = {}
        self.dropped = 0         # events dropped because the journal was over max_bytes
        self.over_bound = False  # the last sweep found it over max_bytes
        for path in sorted(self.root.glob(f"{self.PREFIX}*.log")):
            self.closed[path] = self._scan(path)

    def _path(self) -> Path:
        return self.root / f"{self._name}{self._n:06d}.log"

    def _scan(self, path: Path) -> Segment:
        seg = Segment(path, bytes=path.stat().st_size)
        bad = False
        lines = path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines, 1):
            try:
                coord, offset, _ = parse_line(line)
            except ValueError as err:
                self.on_corrupt(path, i, line, f"journal: {err}")
                bad = True
                continue
            seg.high[coord] = max(seg.high.get(coord, -1), offset)
            seg.events += 1
        if bad:  # rewrite without the lines just moved aside
            self._rewrite(path, [ln for ln in lines if _ok(ln)])
            seg.bytes = path.stat().st_size if path.exists() else 0
        return seg

    # -- the emitter thread's side ------------------------------------------------------------

    def append(self, rows: list[tuple[str, str, int, int, bytes]]) -> None:
        """Record delivered events: (topic, topic id, partition, offset, the value sent)."""
        if not rows:
            return
        data = b"".join(f"{t}\t{tid}\t{p}\t{o}\t".encode() + v + b"\n" for t, tid, p, o, v in rows)
        with open(self.open.path, "ab") as fh:
            fh.write(data)
        for t, tid, p, o, _ in rows:
            key = (t, tid, p)
            self.open.high[key] = max(self.open.high.get(key, -1), o)
        self.open.events += len(rows)
        self.open.bytes += len(data)

    def sweep(self, current: dict[str, str] | None) -> list[Resend]:
        """Close the open segment, delete what the lake holds, trim to the bound, and return the
        events lost with a broker that is gone. ``current``: topic -> the broker's topic id now
        ("" where it has none); None when the broker cannot be asked (nothing is re-sent)."""
        if self.open.events:
            self.closed[self.open.path] = self.open
            self._n += 1
            self.open = Segment(self._path())
        covered = self.marks.refresh(c for seg in self.closed.values() for c in seg.high)
        resend: list[Resend] = []
        for path, seg in list(self.closed.items()):
            waiting = {c: o for c, o in seg.high.items() if o > covered.get(c, -1)}
            if not waiting:
                self._forget(path)
            elif current is not None and any(current.get(c[0]) not in (None, c[1]) for c in waiting):
                resend.append(self._split(seg, covered, current))
        self._trim()
        return resend

    def settle(self, item: Resend) -> None:
        """``item``'s events were delivered again (and journaled anew): keep only the rest."""
        if not item.keep:
            self._forget(item.path)
            return
        self._rewrite(item.path, item.keep)
        self.closed[item.path] = self._scan(item.path)

    def size(self) -> dict[str, int | bool]:
        segs = [*self.closed.values(), self.open]
        return {"journal_segments": len(self.closed) + (1 if self.open.events else 0),
                "journal_events": sum(s.events for s in segs), "journal_bytes": sum(s.bytes for s in segs),
                "journal_max_bytes": self.max_bytes, "journal_over_bound": self.over_bound,
                "journal_dropped": self.dropped}

    # -- internals ----------------------------------------------------------------------------

    def _split(self, seg: Segment, covered: dict[Coord, int], current: dict[str, str]) -> Resend:
        events, keep = [], []
        try:
            text = seg.path.read_text(errors="replace")
        except FileNotFoundError:  # deleted under us (retention, past its period): nothing left to send
            return Resend(seg.path, [], [])
        for i, line in enumerate(text.splitlines(), 1):
            try:
                coord, offset, raw = parse_line(line)
                if offset <= covered.get(coord, -1):
                    continue  # in the lake
                if current.get(coord[0]) in (None, coord[1]):
                    keep.append(line)  # still on the live broker, waiting for ingest
                else:
                    events.append(json.loads(raw))
            except ValueError as err:
                self.on_corrupt(seg.path, i, line, f"journal: {err}")
        return Resend(seg.path, events, keep)

    def _trim(self) -> None:
        total = sum(s.bytes for s in self.closed.values()) + self.open.bytes
        self.over_bound = total > self.max_bytes
        for path in sorted(self.closed):  # oldest first: the likeliest to be in the lake already
            if total <= self.max_bytes:
                break
            seg = self.closed[path]
            total -= seg.bytes
            self.dropped += seg.events
            self._forget(path)

    def _forget(self, path: Path) -> None:
        self.closed.pop(path, None)
        path.unlink(missing_ok=True)

    @staticmethod
    def _rewrite(path: Path, lines: list[str]) -> None:
        if not lines:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(ln + "\n" for ln in lines))
        os.replace(tmp, path)


def _ok(line: str) -> bool:
    try:
        parse_line(line)
        return True
    except ValueError:
        return False
