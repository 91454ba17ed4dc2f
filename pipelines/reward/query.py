"""DuckDB views over the reward datasets.

    rewards             settled turns (append-only) + the latest provisional snapshot;
                        `settled` tells them apart. Training reads `WHERE settled AND labelled`.
    reward_corrections  events that arrived after their turn settled, or never found their turn.

Provisional rows are located through the latest reward manifest, never by
globbing, so a reader never sees two snapshots at once.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from pipelines.lake.store import Lake
from pipelines.reward.engine import CORRECTIONS, PROVISIONAL, REWARDS, reward_state
from pipelines.reward.spec import COMPONENTS

TS = pa.timestamp("us", tz="UTC")
REWARD_SCHEMA = pa.schema(
    [("tenant", pa.string()), ("date", pa.date32()), ("app", pa.string()), ("task", pa.string()),
     ("trace_id", pa.string()), ("turn_id", pa.string()), ("turn_index", pa.int32()), ("turn_time", TS)]
    + [(c, pa.float64()) for c in COMPONENTS]
    + [("dodge", pa.string()), ("labelled", pa.bool_()), ("total", pa.float64()), ("settled", pa.bool_()),
       ("settle_at", TS), ("settle_reason", pa.string()), ("spec_version", pa.string()),
       ("reward_seq", pa.int64()), ("reward_run", pa.string()), ("computed_at", TS)])
CORRECTION_SCHEMA = pa.schema([
    ("tenant", pa.string()), ("date", pa.date32()), ("event_id", pa.string()), ("event_type", pa.string()),
    ("kind", pa.string()), ("app", pa.string()), ("task", pa.string()), ("trace_id", pa.string()),
    ("turn_id", pa.string()), ("event_time", TS), ("reason", pa.string()), ("component", pa.string()),
    ("value", pa.float64()), ("spec_version", pa.string()), ("reward_seq", pa.int64())])

_HIVE = "hive_partitioning = true, hive_types = {'tenant': VARCHAR, 'date': DATE}, union_by_name = true"


def register_views(con: duckdb.DuckDBPyConnection, lake_root: str | Path) -> duckdb.DuckDBPyConnection:
    root = Path(lake_root).resolve()
    names = ", ".join(f.name for f in REWARD_SCHEMA)
    parts = []
    if any((root / REWARDS).rglob("*.parquet")):
        parts.append(f"SELECT {names} FROM read_parquet('{root / REWARDS}/**/*.parquet', {_HIVE})")
    state = reward_state(Lake(root).manifests())
    provisional = [str(root / p) for p in state.files(PROVISIONAL) if (root / p).exists()]
    if provisional:
        parts.append(f"SELECT {names} FROM read_parquet({provisional!r}, hive_partitioning = false, "
                     "union_by_name = true)")
    con.register("_empty_rewards", REWARD_SCHEMA.empty_table())
    parts.append(f"SELECT {names} FROM _empty_rewards")
    con.execute("CREATE OR REPLACE VIEW rewards AS " + " UNION ALL ".join(parts))
    if any((root / CORRECTIONS).rglob("*.parquet")):
        src = f"read_parquet('{root / CORRECTIONS}/**/*.parquet', {_HIVE})"
    else:
        con.register("_empty_reward_corrections", CORRECTION_SCHEMA.empty_table())
        src = "_empty_reward_corrections"
    con.execute(f"CREATE OR REPLACE VIEW reward_corrections AS SELECT * FROM {src}")
    return con
