"""`tracerl lake migrate`: a lake of the layout before Delta Lake onto the Delta tables, in place.

Before, `events` and `quarantine` were Parquet files committed by the lake's manifests
(`store.py`), whose watermarks said which Kafka offsets had landed. The migration, under the lake
lock: recovers a crashed run; appends the committed events files the reward runs had read as
version 1 of the events table (0 is its empty creation; their state, a manifest number, becomes
version 1) and the rest as version 2, whose commit carries the last manifest's watermarks as application
transactions (so ingest resumes after them and the gateway's journal keeps what they cover);
quarantine likewise, in one commit; the trained-turns ledger and the reference logprobs in one
commit each; then the reward runs' datasets (settled rewards, corrections, the latest run's open
state) into their tables and the runs into the run log (`reward_tables.py`), which commits them;
then deletes the old files. Run again after a crash, it
finishes what it began: a table's commits already made (the `tracerl/migrated` transaction marks
its last) are not made again, and old files still there are deleted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.durable import write_json_atomic
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS, QUARANTINE, REFERENCE, TRAINED_TURNS
from pipelines.lake.reward_tables import COMMIT_POINT
from pipelines.lake.store import Lake, Manifest
from pipelines.lake.tables import (
    CORRECTIONS, EVENTS_SCHEMA, LEDGER_SCHEMA, OLD_STATE_KEY, PENDING, PROVISIONAL, QUARANTINE_SCHEMA,
    REFERENCE_SCHEMA, REWARD_RUNS, REWARDS, RUN_SCHEMA, STATE_KEY, TS_US,
)

SCHEMAS = {EVENTS: EVENTS_SCHEMA, QUARANTINE: QUARANTINE_SCHEMA, TRAINED_TURNS: LEDGER_SCHEMA,
           REFERENCE: REFERENCE_SCHEMA}
MIGRATED = "tracerl/migrated"  # an application transaction on each table's last migration commit
READ_VERSION = 1  # version 0 is a table's empty creation (`delta.append`); 1 holds what rewards had read


@dataclass
class MigrationReport:
    rows: dict[str, int] = field(default_factory=dict)       # dataset -> rows moved into its table
    files: dict[str, int] = field(default_factory=dict)      # dataset -> old files moved (and deleted)
    watermarks: dict[str, int] = field(default_factory=dict)  # app id -> last offset carried over
    reward_state: str = ""                                    # what became of the reward runs' state

    def line(self) -> str:
        if not any(self.files.values()):
            return "nothing to migrate: the lake's events, quarantine, ledger and references are Delta tables"
        moved = ", ".join(f"{d}: {self.rows.get(d, 0)} rows from {n} files" for d, n in self.files.items())
        return f"migrated {moved}; {len(self.watermarks)} partition watermarks; {self.reward_state}"


def old_files(root: Path, manifests: list[Manifest], dataset: str) -> list[Path]:
    """The committed files of ``dataset`` under the old layout that are still on disk."""
    paths = [root / f["path"] for m in manifests for f in m.files if f["dataset"] == dataset]
    return [p for p in paths if p.exists()]


def _stored_schema(dataset: str) -> pa.Schema:
    schema = SCHEMAS[dataset]
    for key in delta.PARTITIONS[dataset]:
        schema = schema.append(pa.field(key, pa.string()))
    return schema


def _batches(root: Path, dataset: str, files: list[Path], counted: dict[str, int]) -> Iterator[pa.RecordBatch]:
    """Each old file, conformed to the dataset's schema (a column an older file lacks reads NULL),
    with its partition columns from its folder names."""
    schema = SCHEMAS[dataset]
    for path in files:
        table = pq.read_table(path, partitioning=None)
        cols = [table.column(f.name).cast(f.type) if f.name in table.column_names
                else pa.nulls(table.num_rows, f.type) for f in schema]
        parts = dict(p.split("=", 1) for p in path.relative_to(root / dataset).parts[:-1])
        cols += [pa.array([parts[key]] * table.num_rows, pa.string()) for key in delta.PARTITIONS[dataset]]
        counted[dataset] = counted.get(dataset, 0) + table.num_rows
        yield from pa.Table.from_arrays(cols, schema=_stored_schema(dataset)).to_batches()


def _reader(root: Path, dataset: str, files: list[Path], counted: dict[str, int]) -> pa.RecordBatchReader:
    return pa.RecordBatchReader.from_batches(_stored_schema(dataset), _batches(root, dataset, files, counted))


def migrate(root: Path) -> MigrationReport:
    root = Path(root)
    report = MigrationReport()
    lake = Lake(root)
    if not lake.log.exists():
        return report
    with lake.locked():
        lake.recover()
        manifests = lake.manifests()
        _migrate_ingest(root, lake, manifests, report)
        for dataset in (TRAINED_TURNS, REFERENCE):
            _migrate_learner(root, manifests, dataset, report)
        _migrate_rewards(root, lake.manifests(), report)  # after the ingest step rewrote their state
        with contextlib.suppress(OSError):
            lake.staging.rmdir()  # the old layout's staging folder, empty once recovered
    return report


def _reward_rows(root: Path, dataset: str, files: list[tuple[Path, Manifest]], snapshot: str | None,
                 counted: dict[str, int]) -> pa.Table:
    """Old files of a reward dataset as its table's rows: partition columns from the folder names
    (``snapshot``: the run id, for the open state), ``reward_run`` from the manifest where the file lacks it."""
    parts = []
    for path, m in files:
        table = pq.read_table(path, partitioning=None)
        names = dict(p.split("=", 1) for p in path.relative_to(root / dataset).parts[:-1])
        for key in delta.PARTITIONS[dataset]:
            if key == "snapshot":
                table = table.append_column(key, pa.array([snapshot] * table.num_rows, pa.string()))
            elif key not in table.column_names:
                table = table.append_column(key, pa.array([names[key]] * table.num_rows).cast(
                    delta.PARTITION_TYPES[key]))
        if dataset in (REWARDS, CORRECTIONS) and "reward_run" not in table.column_names:
            table = table.append_column("reward_run", pa.array([m.run_id] * table.num_rows, pa.string()))
        counted[dataset] = counted.get(dataset, 0) + table.num_rows
        parts.append(table)
    return pa.concat_tables(parts, promote_options="default")


def _migrate_rewards(root: Path, manifests: list[Manifest], report: MigrationReport) -> None:
    """Each reward dataset's old files in one commit (marked `MIGRATED`), the runs last: the run log's
    commit is what makes them read. Then the old files are deleted."""
    runs = [m for m in manifests if STATE_KEY in m.counts or OLD_STATE_KEY in m.counts]
    if not runs:
        return
    latest = runs[-1]
    every = {d: [(root / f["path"], m) for m in runs for f in m.files if f["dataset"] == d]
             for d in (REWARDS, CORRECTIONS, PROVISIONAL, PENDING)}
    every = {d: [(p, m) for p, m in files if p.exists()] for d, files in every.items()}
    log = delta.open_table(root, REWARD_RUNS)
    if log is None or log.transaction_version(MIGRATED) is None:
        for dataset, files in every.items():
            if dataset in (PROVISIONAL, PENDING):
                files = [(p, m) for p, m in files if m.run_id == latest.run_id]
            table = delta.open_table(root, dataset)
            if files and (table is None or table.transaction_version(MIGRATED) is None):
                report.files[dataset] = len(files)
                delta.append(root, dataset, _reward_rows(root, dataset, files, latest.run_id, report.rows),
                             marks={MIGRATED: 1}, migrating=True)
        rows = pa.table({
            "run_id": [m.run_id for m in runs], "seq": [m.seq for m in runs],
            "events_version": [int(m.counts.get(STATE_KEY, -1)) for m in runs],
            "committed_at": pa.array([int(m.created_at * 1e6) for m in runs], TS_US),
            **{k: [int(m.counts.get(f"reward_{k}", 0)) for m in runs]
               for k in ("settled", "provisional", "corrections", "pending")},
            "events_files": [None] * len(runs)}, schema=RUN_SCHEMA)  # only their events_version is known
        delta.append(root, REWARD_RUNS, rows, marks={MIGRATED: 1, COMMIT_POINT: latest.seq}, migrating=True)
        report.rows[REWARD_RUNS] = len(runs)
    _remove(root, [path for files in every.values() for path, _ in files])


def _migrate_learner(root: Path, manifests: list[Manifest], dataset: str, report: MigrationReport) -> None:
    """A learner dataset's old files in one commit (marked `MIGRATED`: not made twice), then deleted."""
    files = old_files(root, manifests, dataset)
    if not files:
        return
    report.files[dataset] = len(files)
    table = delta.open_table(root, dataset)
    if table is None or table.transaction_version(MIGRATED) is None:
        delta.append(root, dataset, _reader(root, dataset, files, report.rows), marks={MIGRATED: 1}, migrating=True)
    _remove(root, files)


def _migrate_ingest(root: Path, lake: Lake, manifests: list[Manifest], report: MigrationReport) -> None:
    """events and quarantine, with the watermarks and the reward runs' place (module docstring)."""
    ingest = [m for m in manifests if any(f["dataset"] in (EVENTS, QUARANTINE) for f in m.files)
              or m.watermarks]
    if not ingest:
        return
    rewards = [m for m in manifests if STATE_KEY in m.counts or OLD_STATE_KEY in m.counts]
    latest = rewards[-1] if rewards else None
    read_through = int(latest.counts.get(OLD_STATE_KEY, 0)) if latest is not None else 0
    last = ingest[-1]
    coords = {}
    for tp, offset in last.watermarks.items():
        topic, part = tp.rsplit(":", 1)
        coords[(topic, last.topic_ids.get(topic) or "", int(part))] = offset
    report.watermarks = {delta.app_id(c): v for c, v in coords.items()}
    for dataset in (QUARANTINE, EVENTS):  # events last: its commit is what marks the offsets landed
        read = old_files(root, [m for m in ingest if m.seq <= read_through], dataset)
        unread = old_files(root, [m for m in ingest if m.seq > read_through], dataset)
        report.files[dataset] = len(read) + len(unread)
        if dataset == QUARANTINE:
            read, unread = [], read + unread  # no reward state refers to it
        table = delta.open_table(root, dataset)  # only the migration writes while old files exist
        if table is None or table.version() < READ_VERSION:
            delta.append(root, dataset, _reader(root, dataset, read, report.rows),
                         None if unread else coords, None if unread else {MIGRATED: 1}, migrating=True)
            table = delta.open_table(root, dataset)
        if table.transaction_version(MIGRATED) is None:  # the rest, with the watermarks
            delta.append(root, dataset, _reader(root, dataset, unread, report.rows), coords, {MIGRATED: 1})
    if latest is not None and STATE_KEY not in latest.counts:
        moved = dataclasses.replace(latest, counts={**latest.counts, STATE_KEY: READ_VERSION})
        write_json_atomic(lake.log / f"{latest.name}.json", moved.__dict__)
        report.reward_state = f"the reward runs have read events version {READ_VERSION}"
    else:
        report.reward_state = "reward state unchanged"
    _remove(root, [path for dataset in (QUARANTINE, EVENTS) for path in old_files(root, ingest, dataset)])


def _remove(root: Path, paths: list[Path]) -> None:
    """Delete migrated files, then the folders of the old layout they leave empty (a reward run's
    snapshot folder, a partition no Delta file went to), up to the lake folder."""
    for path in paths:
        os.remove(path)
    for folder in sorted({p.parent for p in paths}, key=lambda f: -len(f.parts)):
        while folder != root and root in folder.parents:
            try:
                folder.rmdir()  # only an empty one: a partition Delta writes to keeps its files
            except OSError:
                break
            folder = folder.parent
