"""The trained-turns ledger: which turns each adapter version trained on, a Delta table.

One row per (turn, use), one commit per learner step, whole or not at all (`delta.py`), beside
`events` where `[tables]` puts them, so learners of different targets on different hosts append
to it at once. The learner writes it (a turn with no row is "new"; it replays until it has
`learner.replay_max_uses` rows; a row with adapter_version 0 marks a turn excluded as an eval
prompt: never trained, never replayed) and reads it for replay; the gate reads it to check a
candidate's training data for eval prompts. It lives here, beside the other tables, so neither
stage imports the other for it. Schema: `tables.LEDGER_SCHEMA`, partitioned by tenant.
"""

from __future__ import annotations

import time

import duckdb
import pyarrow as pa

from pipelines.lake import delta
from pipelines.lake.delta import TRAINED_TURNS
from pipelines.lake.tables import LEDGER_SCHEMA

__all__ = ["TRAINED_TURNS", "has_ledger", "ledger_source", "record_ledger"]


def has_ledger(tables: delta.Where) -> bool:
    """True once any ledger row landed (before that, nothing was trained)."""
    return bool(delta.files(tables, TRAINED_TURNS)[1])


def ledger_source(con: duckdb.DuckDBPyConnection, tables: delta.Where) -> str:
    """SQL relation on ``con`` of every ledger row (tenant, task, turn_id, adapter_version, ...);
    an empty typed relation before the first row."""
    _, paths = delta.files(tables, TRAINED_TURNS)
    if paths:
        return delta.scan(con, tables, TRAINED_TURNS, paths, "_ledger")
    return ("(SELECT NULL::VARCHAR AS tenant, NULL::VARCHAR AS task, NULL::VARCHAR AS turn_id, "
            "NULL::BIGINT AS adapter_version, NULL::BIGINT AS use, NULL::DOUBLE AS weight WHERE false)")


def record_ledger(tables: delta.Where, tenant: str, task: str, turn_ids: list[str], version: int,
                  uses: list[int] | None = None, weights: list[float] | None = None) -> int:
    """One row per (turn, use); ``uses`` defaults to 1 (first use), 0 for version 0 (excluded);
    ``weights`` to 1. The ledger's new version."""
    now = int(time.time() * 1000)
    n = len(turn_ids)
    table = pa.table({"task": [task] * n, "turn_id": turn_ids, "adapter_version": [version] * n,
                      "trained_at": [now] * n, "use": uses if uses is not None else [1 if version else 0] * n,
                      "weight": weights if weights is not None else [1.0] * n, "tenant": [tenant] * n},
                     schema=LEDGER_SCHEMA.append(pa.field("tenant", pa.string())))
    return delta.append(tables, TRAINED_TURNS, table, info={"tracerl.run": f"learner-{tenant}-{task}-v{version}"})
