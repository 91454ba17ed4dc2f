"""DuckDB over the lake: one view per event type, typed from the raw JSON payload.

Fields ingest also stores as typed columns (`tables.HOT_COLUMNS`) are read from
those columns, not parsed from the payload (lake format 2, see `tables.py`).

    from pipelines.lake.query import connect
    con = connect(".tracerl/lake")
    con.sql("SELECT task, count(*) FROM turns GROUP BY ALL").show()

Views: events, turns, tool_calls, feedback, session_ends, quarantine, and the reward
stage's rewards and reward_corrections (`register_reward_views`). Every schema is in `tables.py`.
Each event type's view has `user_id`: the event's `user`, a pseudonym (docs/privacy.md).
The same views back `tracerl sql` and every later stage (rewards, learner).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from pipelines.config.tables import TableStore
from pipelines.contract.events import V1_ADAPTER_VERSION
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS, QUARANTINE
from pipelines.lake import reward_tables
from pipelines.lake.tables import EVENTS_SCHEMA, QUARANTINE_SCHEMA

_ENVELOPE = "event_id, tenant, date, app, task, trace_id, turn_id, event_time"

# view -> (event type, [(column, source, SQL type)]); the source is a JSON path ('$.x') or the name of
# a stored hot column of the same type. JSON keeps nested values queryable.
TYPED_VIEWS: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "turns": ("model_turn", [
        ("turn_index", "turn_index", "INTEGER"),
        ("model", "$.model", "VARCHAR"),
        ("adapter_version", "$.adapter_version", "BIGINT"),  # the int that served it; NULL = base model
        ("input_messages", "$.input_messages", "JSON"),
        ("output_text", "output_text", "VARCHAR"),
        ("output_token_ids", "$.output_token_ids", "INTEGER[]"),
        ("output_logprobs", "$.output_logprobs", "DOUBLE[]"),
        ("prompt_token_ids", "$.prompt_token_ids", "INTEGER[]"),
        ("sampling", "$.sampling", "JSON"),
        ("finish_reason", "$.finish_reason", "VARCHAR"),
        ("latency_ms", "latency_ms", "DOUBLE"),
        ("train", "$.train", "BOOLEAN"),  # false: never trained on (eval traffic, no consent)
        ("arm", "$.arm", "VARCHAR"),  # champion | challenger while a canary ran; NULL otherwise
        ("user_id", "user_id", "VARCHAR"),  # the end user's pseudonym (u_ + 32 hex); NULL: none named
    ]),
    "tool_calls": ("tool_call", [
        ("call_id", "call_id", "VARCHAR"),
        ("name", "$.name", "VARCHAR"),
        ("arguments", "$.arguments", "JSON"),
        ("outcome", "kind", "VARCHAR"),
        ("error", "$.error", "VARCHAR"),
        ("attempt", "attempt", "INTEGER"),
        ("latency_ms", "latency_ms", "DOUBLE"),
        ("user_id", "user_id", "VARCHAR"),
    ]),
    "feedback": ("feedback", [
        ("kind", "kind", "VARCHAR"),
        ("value", "value", "DOUBLE"),
        ("scale_min", "scale_min", "DOUBLE"),
        ("scale_max", "scale_max", "DOUBLE"),
        ("text", "$.text", "VARCHAR"),
        ("sentiment", "sentiment", "VARCHAR"),
        ("user_id", "user_id", "VARCHAR"),
    ]),
    "session_ends": ("session_end", [
        ("outcome", "kind", "VARCHAR"),
        ("task_success", "task_success", "BOOLEAN"),
        ("turns", "$.turns", "INTEGER"),
        ("user_id", "user_id", "VARCHAR"),
    ]),
}

# (view, column) -> what the column reads where the field is absent: a turn from before the
# `train` field existed was always trainable.
VIEW_DEFAULTS: dict[tuple[str, str], str] = {("turns", "train"): "true"}

# (view, column) -> how a schema_version 1 row reads it, where version 1 differs: its adapter version
# was text, "v3" (`events.V1_ADAPTER_VERSION`; ingest quarantined any other text). Older lakes too.
V1_SOURCES: dict[tuple[str, str], str] = {
    ("turns", "adapter_version"): "TRY_CAST(regexp_extract(json_extract_string(_json, '$.adapter_version'), "
                                  f"'^{V1_ADAPTER_VERSION}$', 1) AS BIGINT)",
}


def _extract(path: str, sql_type: str, stored: set[str] | None = None) -> str:
    """SQL for one typed column. Defensive, so one bad row can never fail a whole query: the payload
    is parsed with TRY_CAST (`_json`: NULL where malformed) and numbers are TRY_CAST (NULL where out
    of range). Ingest's validation already keeps such rows out (`contract/validate.py`). A hot
    column no file of the lake has yet (a lake older than the column) reads NULL."""
    if not path.startswith("$"):
        return path if stored is None or path in stored else f"NULL::{sql_type}"  # a stored hot column
    if sql_type == "VARCHAR":
        return f"json_extract_string(_json, '{path}')"
    if sql_type == "JSON":
        return f"json_extract(_json, '{path}')"
    return f"TRY_CAST(json_extract(_json, '{path}') AS {sql_type})"


def _with_default(sql: str, default: str | None) -> str:
    return sql if default is None else f"COALESCE({sql}, {default})"


def _column(view: str, name: str, path: str, sql_type: str, stored: set[str] | None = None) -> str:
    sql = _extract(path, sql_type, stored)
    v1 = V1_SOURCES.get((view, name))
    if v1 is not None:
        sql = f"CASE WHEN schema_version = 1 THEN {v1} ELSE {sql} END"
    return f"{_with_default(sql, VIEW_DEFAULTS.get((view, name)))} AS {name}"


def _source(con: duckdb.DuckDBPyConnection, tables: delta.Where, dataset: str, schema: pa.Schema) -> str:
    """The Delta table's current files (`delta.files`: a file is in the lake once a commit names
    it, so a half-written append is never read), or an empty typed relation before anything landed."""
    _, paths = delta.files(tables, dataset)
    if paths:
        return delta.scan(con, tables, dataset, paths, f"_table_{dataset}")
    empty = pa.table({f.name: pa.array([], f.type) for f in schema})
    for name in delta.PARTITIONS[dataset]:
        empty = empty.append_column(name, pa.array([], pa.string() if name == "tenant" else pa.date32()))
    con.register(f"_empty_{dataset}", empty)
    return f"_empty_{dataset}"


def register_reward_views(con: duckdb.DuckDBPyConnection, where: delta.Where) -> duckdb.DuckDBPyConnection:
    """``rewards``: settled turns (append-only) + the latest provisional snapshot, ``settled`` tells
    them apart (training reads ``WHERE settled AND labelled``); ``reward_corrections``: events that
    arrived after their turn settled, or never found it. Both as of one snapshot of the reward run
    log (`reward_tables.py`), so a reader never sees two snapshots, or a run not committed."""
    state = reward_tables.reward_state(where)
    con.execute(f"CREATE OR REPLACE VIEW rewards AS SELECT * FROM {reward_tables.settled(con, where, state)} "
                f"UNION ALL SELECT * FROM {reward_tables.provisional(con, where, state)}")
    con.execute(f"CREATE OR REPLACE VIEW reward_corrections AS SELECT * FROM "
                f"{reward_tables.corrections(con, where, state)}")
    return con


def create_views(con: duckdb.DuckDBPyConnection, lake_root: str | Path,
                 tables: TableStore | None = None) -> duckdb.DuckDBPyConnection:
    """``tables``: where the Delta tables are (`TracerlConfig.table_store`); None = the lake folder."""
    root = Path(lake_root).resolve()
    tables = tables or delta.store_of(root)
    events = _source(con, tables, EVENTS, EVENTS_SCHEMA)
    con.execute(f"CREATE OR REPLACE VIEW events AS SELECT * FROM {events}")
    stored = {r[0] for r in con.execute("DESCRIBE events").fetchall()}
    for view, (event_type, cols) in TYPED_VIEWS.items():
        typed = ", ".join(_column(view, name, path, t, stored) for name, path, t in cols)
        con.execute(
            f"CREATE OR REPLACE VIEW {view} AS SELECT {_ENVELOPE}, {typed}, _json AS payload "
            f"FROM (SELECT *, TRY_CAST(payload AS JSON) AS _json FROM events WHERE type = '{event_type}')"
        )
    quarantine = _source(con, tables, QUARANTINE, QUARANTINE_SCHEMA)
    con.execute(f"CREATE OR REPLACE VIEW quarantine AS SELECT * FROM {quarantine}")
    return register_reward_views(con, tables)


def connect(lake_root: str | Path, tables: TableStore | None = None,
            database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    return create_views(duckdb.connect(database), lake_root, tables)
