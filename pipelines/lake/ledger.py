"""The trained-turns ledger: which turns each adapter version trained on, in the lake.

One row per (turn, use), committed through the lake's manifest protocol (`store.py`), so it
commits whole or not at all. The learner writes it (a turn with no row is "new"; it replays until
it has `learner.replay_max_uses` rows; a row with adapter_version 0 marks a turn excluded as an
eval prompt: never trained, never replayed) and reads it for replay; the gate reads it to check a
candidate's training data for eval prompts. It lives here, beside the other tables, so neither
stage imports the other for it. Schema: `tables.LEDGER_SCHEMA`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from pipelines.lake.store import Lake
from pipelines.lake.tables import LEDGER_SCHEMA

TRAINED_TURNS = "trained_turns"


def has_ledger(lake_root: Path) -> bool:
    """True once any ledger row landed (before that, nothing was trained)."""
    return any((Path(lake_root) / TRAINED_TURNS).rglob("*.parquet"))


def ledger_source(lake_root: Path) -> str:
    """SQL relation of every ledger row (tenant, task, turn_id, adapter_version, ...); an empty
    typed relation before the first row."""
    folder = Path(lake_root).resolve() / TRAINED_TURNS
    if any(folder.rglob("*.parquet")):
        return (f"read_parquet('{folder}/**/*.parquet', hive_partitioning = true, union_by_name = true, "
                f"hive_types = {{'tenant': VARCHAR}})")
    return ("(SELECT NULL::VARCHAR AS tenant, NULL::VARCHAR AS task, NULL::VARCHAR AS turn_id, "
            "NULL::BIGINT AS adapter_version WHERE false)")


def record_ledger(lake_root: Path, tenant: str, task: str, turn_ids: list[str], version: int,
                  uses: list[int] | None = None, weights: list[float] | None = None) -> None:
    """One row per (turn, use); ``uses`` defaults to 1 (first use), 0 for version 0 (excluded);
    ``weights`` to 1."""
    lake = Lake(lake_root)
    now = int(time.time() * 1000)
    n = len(turn_ids)
    table = pa.table({"task": [task] * n, "turn_id": turn_ids, "adapter_version": [version] * n,
                      "trained_at": [now] * n, "use": uses if uses is not None else [1 if version else 0] * n,
                      "weight": weights if weights is not None else [1.0] * n},
                     schema=LEDGER_SCHEMA)
    with lake.locked():
        txn = lake.begin(f"learner-{tenant}-{task}-v{version}")
        txn.stage(TRAINED_TURNS, {"tenant": tenant}, table)
        txn.commit({}, {"trained_turns": n})
        txn.publish()
