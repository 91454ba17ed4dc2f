"""Delta Lake against Apache Iceberg for the lake's commits, side by side in one run (issue #18).

What ingest does per run, in each format, on local disk: read the exactly-once watermark of the
partitions it consumed, then append one batch of events (partitioned by tenant and date) with the
new watermark in the same atomic commit. Delta: `write_deltalake` with application transactions
(one per topic-partition, the offset as version; `DeltaTable.transaction_version` reads it back).
Iceberg: `pyiceberg` with a SQL catalog (SQLite), `Table.append` with the offsets in the
snapshot summary, read back from the current snapshot. Then a full read of the events through
DuckDB over each format's current file list (what the views do). The formats alternate,
ROUNDS times, each round into empty tables; the last line is the median of the rounds' ratios.

    .venv/bin/python bench/lake_format.py
Last line: delta_vs_iceberg_commit_s=<median of Delta's ingest-commit time / Iceberg's>  (< 1: Delta faster)
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

COMMITS = 30
ROWS = 2000          # events per ingest run (a demo iteration lands ~1-3k)
PARTITIONS = 2       # Kafka partitions per run
ROUNDS = 3

SCHEMA = pa.schema([("event_id", pa.string()), ("type", pa.string()), ("trace_id", pa.string()),
                    ("payload", pa.string()), ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()),
                    ("tenant", pa.string()), ("date", pa.string())])


def batch(i: int, rng: np.random.Generator) -> pa.Table:
    n = ROWS
    payload = "x" * 700
    return pa.table({
        "event_id": [f"e-{i}-{k}" for k in range(n)],
        "type": rng.choice(["model_turn", "feedback", "tool_call"], n).tolist(),
        "trace_id": [f"t-{i}-{k // 4}" for k in range(n)],
        "payload": [payload] * n,
        "kafka_partition": pa.array([k % PARTITIONS for k in range(n)], pa.int32()),
        "kafka_offset": pa.array([i * ROWS + k for k in range(n)], pa.int64()),
        "tenant": rng.choice(["acme", "globex"], n).tolist(),
        "date": ["2026-12-05"] * n,
    }, schema=SCHEMA)


def offsets(i: int) -> dict[str, int]:
    return {f"events:{p}": (i + 1) * ROWS - PARTITIONS + p for p in range(PARTITIONS)}


def scan(files: list[str]) -> int:
    con = duckdb.connect()
    return con.sql(f"SELECT count(*) FROM read_parquet({files!r}, hive_partitioning = true)").fetchall()[0][0]


def run_delta(root: Path, batches: list[pa.Table]) -> tuple[float, float]:
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    uri = str(root / "events")
    start = time.perf_counter()
    for i, b in enumerate(batches):
        if DeltaTable.is_deltatable(uri):
            dt = DeltaTable(uri)
            assert all(dt.transaction_version(k) in (None, v - ROWS) for k, v in offsets(i).items())
        txns = [Transaction(app_id=k, version=v) for k, v in offsets(i).items()]
        write_deltalake(uri, b, mode="append", partition_by=["tenant", "date"],
                        commit_properties=CommitProperties(app_transactions=txns))
    commit = time.perf_counter() - start
    start = time.perf_counter()
    assert scan(DeltaTable(uri).file_uris()) == COMMITS * ROWS
    return commit, time.perf_counter() - start


def run_iceberg(root: Path, batches: list[pa.Table]) -> tuple[float, float]:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("bench", uri=f"sqlite:///{root / 'catalog.db'}", warehouse=(root / "wh").as_uri())
    catalog.create_namespace("lake")
    table = catalog.create_table("lake.events", schema=SCHEMA)
    with table.update_spec() as spec:
        spec.add_identity("tenant")
        spec.add_identity("date")
    start = time.perf_counter()
    for i, b in enumerate(batches):
        table = catalog.load_table("lake.events")  # another run's commit: the watermark as of now
        snap = table.current_snapshot()
        if snap is not None:
            assert all(int(snap.summary[k]) == v - ROWS for k, v in offsets(i).items())
        table.append(b, snapshot_properties={k: str(v) for k, v in offsets(i).items()})
    commit = time.perf_counter() - start
    start = time.perf_counter()
    files = [t.file.file_path.removeprefix("file://") for t in catalog.load_table("lake.events").scan().plan_files()]
    assert scan(files) == COMMITS * ROWS
    return commit, time.perf_counter() - start


def main() -> None:
    rng = np.random.default_rng(0)
    batches = [batch(i, rng) for i in range(COMMITS)]
    ratios, read_ratios = [], []
    for r in range(ROUNDS):
        times = {}
        for name, fn in (("delta", run_delta), ("iceberg", run_iceberg)):
            root = Path(tempfile.mkdtemp(prefix=f"tracerl-lake-{name}-"))
            try:
                times[name] = fn(root, batches)
            finally:
                shutil.rmtree(root, ignore_errors=True)
        (dc, dr), (ic, ir) = times["delta"], times["iceberg"]
        print(f"round {r + 1}: {COMMITS} commits of {ROWS} events: delta {dc:.2f} s "
              f"({dc / COMMITS * 1000:.0f} ms each), iceberg {ic:.2f} s ({ic / COMMITS * 1000:.0f} ms each); "
              f"full read delta {dr:.3f} s, iceberg {ir:.3f} s", flush=True)
        ratios.append(dc / ic)
        read_ratios.append(dr / ir)
    print(f"delta_vs_iceberg_read_s={statistics.median(read_ratios):.3f}")
    print(f"delta_vs_iceberg_commit_s={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
