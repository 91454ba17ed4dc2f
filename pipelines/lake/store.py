"""The lake on disk, and the commit protocol that makes ingest exactly-once.

Layout under the lake root:

    events/tenant=<t>/date=<YYYY-MM-DD>/part-<seq>-<run>-<n>.parquet
    quarantine/date=<YYYY-MM-DD>/part-<seq>-<run>-<n>.parquet
    _log/<seq>-<run>.json          commit manifests, one per run (the commit point)
    _log/<seq>-<run>.published     marker: the manifest's files are all in place
    _staging/<run>/...             files of a run not yet committed
    _lock                          serializes commits of concurrent writers

A run stages its files (fsync'd), writes its manifest atomically, then moves
the files into place and writes the marker. Readers glob the dataset folders,
so they never see a file of an uncommitted run. After a crash, `recover()`
rolls committed runs forward and deletes staging of uncommitted ones. Each
manifest also carries the Kafka high watermark per topic-partition *after*
that run, so the lake itself knows which offsets it holds; ingest uses that to
skip anything already landed, whatever Kafka's committed offsets say.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.durable import fsync_dir, write_json_atomic

EVENTS = "events"
QUARANTINE = "quarantine"


# Columns worth dictionary-encoding: few distinct values. Hashing unique ids and
# kilobyte payloads for a dictionary that is then abandoned costs ~40% of a write.
DICTIONARY_COLUMNS = ["type", "app", "task", "kafka_topic", "run_id", "reason"]


def write_parquet_durable(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pq.write_table(table, f, compression="zstd",
                       use_dictionary=[c for c in DICTIONARY_COLUMNS if c in table.column_names])
        f.flush()
        os.fsync(f.fileno())


@dataclass
class Manifest:
    seq: int
    run_id: str
    created_at: float
    files: list[dict]                  # {"path": relative final path, "rows": n, "dataset": ...}
    offsets: dict[str, list[int]]      # "topic:partition" -> [first, last] consumed this run
    watermarks: dict[str, int]         # "topic:partition" -> last offset held by the lake
    counts: dict[str, int] = field(default_factory=dict)
    topic_ids: dict[str, str] = field(default_factory=dict)  # topic -> Kafka topic id the watermarks refer to

    @property
    def name(self) -> str:
        return f"{self.seq:012d}-{self.run_id}"


class Lake:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.log = self.root / "_log"
        self.staging = self.root / "_staging"

    def dataset(self, name: str) -> Path:
        return self.root / name

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive commit lock (flock: one host; an object-store lake needs a catalog instead)."""
        self.log.mkdir(parents=True, exist_ok=True)
        with open(self.root / "_lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # -- reading the log ---------------------------------------------------
    def manifests(self) -> list[Manifest]:
        if not self.log.exists():
            return []
        out = [Manifest(**json.loads(p.read_text())) for p in sorted(self.log.glob("*.json"))]
        return sorted(out, key=lambda m: m.seq)

    def latest(self) -> Manifest | None:
        names = sorted(self.log.glob("*.json")) if self.log.exists() else []
        return Manifest(**json.loads(names[-1].read_text())) if names else None

    def watermarks(self, topic_ids: dict[str, str] | None = None) -> dict[str, int]:
        """Last landed offset per "topic:partition". With the topics' current Kafka ids, the
        watermarks of a topic that was deleted and created again (its offsets start over: an
        in-memory broker restarted, a topic recreated by hand) are left out."""
        m = self.latest()
        if m is None:
            return {}
        stale = {t for t, tid in (topic_ids or {}).items() if m.topic_ids.get(t) not in (None, tid)}
        return {tp: v for tp, v in m.watermarks.items() if tp.rsplit(":", 1)[0] not in stale}

    # -- recovery ------------------------------------------------------------
    def recover(self) -> dict[str, int]:
        """Roll committed runs forward, discard uncommitted staging. Call under `locked()`."""
        rolled, discarded = 0, 0
        committed = set()
        for m in self.manifests():
            committed.add(m.run_id)
            if not (self.log / f"{m.name}.published").exists():
                self._publish(m)
                rolled += 1
        if self.staging.exists():
            for run_dir in self.staging.iterdir():
                if run_dir.name not in committed:
                    shutil.rmtree(run_dir)
                    discarded += 1
        return {"rolled_forward": rolled, "discarded": discarded}

    def _publish(self, m: Manifest) -> None:
        dirs = set()
        for f in m.files:
            staged, final = self.staging / m.run_id / f["path"], self.root / f["path"]
            if staged.exists():
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, final)
                dirs.add(final.parent)
            elif not final.exists():
                raise RuntimeError(f"lake is damaged: {f['path']} of run {m.run_id} is neither staged nor published")
        for d in dirs:
            fsync_dir(d)
        marker = self.log / f"{m.name}.published"
        marker.touch()
        fsync_dir(self.log)
        shutil.rmtree(self.staging / m.run_id, ignore_errors=True)

    # -- writing -------------------------------------------------------------
    def begin(self, run_id: str) -> "Transaction":
        return Transaction(self, run_id)


class Transaction:
    """Stage files, then `commit()` (the atomic point), then `publish()`."""

    def __init__(self, lake: Lake, run_id: str):
        self.lake, self.run_id = lake, run_id
        self.files: list[dict] = []
        self.manifest: Manifest | None = None
        prev = lake.latest()
        self.seq = (prev.seq + 1) if prev else 1
        self.base_watermarks = dict(prev.watermarks) if prev else {}
        self.base_topic_ids = dict(prev.topic_ids) if prev else {}

    def stage(self, dataset: str, partition: dict[str, str], table: pa.Table) -> str:
        parts = "/".join(f"{k}={v}" for k, v in partition.items())
        rel = f"{dataset}/{parts}/part-{self.seq:012d}-{self.run_id}-{len(self.files)}.parquet"
        write_parquet_durable(table, self.lake.staging / self.run_id / rel)
        self.files.append({"path": rel, "rows": table.num_rows, "dataset": dataset})
        return rel

    def commit(self, offsets: dict[str, list[int]], counts: dict[str, int],
               topic_ids: dict[str, str] | None = None) -> Manifest:
        """`topic_ids`: the Kafka ids of the topics read; a topic whose id changed starts its
        watermarks over (its offsets belong to a new log)."""
        topic_ids = {**self.base_topic_ids, **(topic_ids or {})}
        reset = {t for t, tid in topic_ids.items() if self.base_topic_ids.get(t) not in (None, tid)}
        watermarks = {tp: v for tp, v in self.base_watermarks.items() if tp.rsplit(":", 1)[0] not in reset}
        for tp, (_, last) in offsets.items():
            watermarks[tp] = max(watermarks.get(tp, -1), last)
        for d in {Path(f["path"]).parent for f in self.files}:
            fsync_dir(self.lake.staging / self.run_id / d)
        self.manifest = Manifest(self.seq, self.run_id, time.time(), self.files, offsets, watermarks, counts,
                                 topic_ids)
        write_json_atomic(self.lake.log / f"{self.manifest.name}.json", self.manifest.__dict__)
        return self.manifest

    def publish(self) -> None:
        assert self.manifest is not None, "commit() before publish()"
        self.lake._publish(self.manifest)
