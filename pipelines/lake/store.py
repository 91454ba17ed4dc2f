"""The lake's earlier layout: Parquet files committed by manifests under one host's lock.

Every dataset is a Delta Lake table now (`delta.py`, `reward_tables.py`); this stays for
`tracerl lake migrate` (`migrate.py`), which reads a lake of this layout, and for its tests,
which write one. Layout:

    events/..., rewards/..., reward_*/..., reference/...   the datasets' files
    _log/<seq>-<run>.json          commit manifests, one per run (the commit point)
    _log/<seq>-<run>.published     marker: the manifest's files are all in place
    _staging/<run>/...             files of a run not yet committed
    _lock                          serializes commits of concurrent writers

A run staged its files (fsync'd), wrote its manifest atomically, then moved the files into
place and wrote the marker. After a crash, `recover()` rolls committed runs forward and
deletes staging of uncommitted ones (migration runs it first).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.durable import file_lock, fsync_dir, write_json_atomic
from pipelines.lake.delta import DICTIONARY_COLUMNS


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
    offsets: dict[str, list[int]]      # ingest runs before the Delta events table: offsets consumed
    watermarks: dict[str, int]         # and the lake's watermarks then (read by `migrate.py`)
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

    def locked(self) -> AbstractContextManager[None]:
        """Exclusive commit lock (flock: one host; what the Delta tables need no more)."""
        self.log.mkdir(parents=True, exist_ok=True)
        return file_lock(self.root / "_lock")

    # -- reading the log ---------------------------------------------------
    def manifests(self) -> list[Manifest]:
        if not self.log.exists():
            return []
        out = [Manifest(**json.loads(p.read_text())) for p in sorted(self.log.glob("*.json"))]
        return sorted(out, key=lambda m: m.seq)

    def latest(self) -> Manifest | None:
        names = sorted(self.log.glob("*.json")) if self.log.exists() else []
        return Manifest(**json.loads(names[-1].read_text())) if names else None

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

    def stage(self, dataset: str, partition: dict[str, str], table: pa.Table) -> str:
        parts = "/".join(f"{k}={v}" for k, v in partition.items())
        rel = f"{dataset}/{parts}/part-{self.seq:012d}-{self.run_id}-{len(self.files)}.parquet"
        write_parquet_durable(table, self.lake.staging / self.run_id / rel)
        self.files.append({"path": rel, "rows": table.num_rows, "dataset": dataset})
        return rel

    def commit(self, offsets: dict[str, list[int]], counts: dict[str, int]) -> Manifest:
        for d in {Path(f["path"]).parent for f in self.files}:
            fsync_dir(self.lake.staging / self.run_id / d)
        self.manifest = Manifest(self.seq, self.run_id, time.time(), self.files, offsets, {}, counts)
        write_json_atomic(self.lake.log / f"{self.manifest.name}.json", self.manifest.__dict__)
        return self.manifest

    def publish(self) -> None:
        assert self.manifest is not None, "commit() before publish()"
        self.lake._publish(self.manifest)
