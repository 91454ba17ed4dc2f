"""Arrow schemas of the landed datasets, and rows -> tables.

`events` keeps typed envelope columns for partition pruning and joins, plus
`payload`: the event's JSON exactly as the producer sent it. Keeping the raw
JSON means a field added by a newer producer survives ingest untouched; the
DuckDB views (`pipelines/lake/query.py`) give each event type typed columns.
`tenant` and `date` are not stored in the files: they are hive partitions.

A few *hot* fields are also stored as typed columns (`HOT_COLUMNS`, filled by
`decode.hot_fields`), so the reward extraction and the views read columns
instead of parsing every payload. They are copies: `payload` stays the source
of truth. They came with lake format 2 (pre-release, no format-1 lake was
deployed): a format-1 file beside format-2 files reads NULL in them, and a lake
of format-1 files only does not bind; re-ingest it from Kafka.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("ms", tz="UTC")

# Hot fields, NULL where the event type has no such field (`decode.hot_fields` fills them, in this order).
HOT_COLUMNS = [
    ("kind", pa.string()),          # feedback: kind; tool_call, session_end: outcome
    ("value", pa.float64()),        # feedback
    ("scale_min", pa.float64()),    # feedback
    ("scale_max", pa.float64()),    # feedback
    ("sentiment", pa.string()),     # feedback
    ("task_success", pa.bool_()),   # session_end
    ("call_id", pa.string()),       # tool_call
    ("attempt", pa.int32()),        # tool_call, as sent (NULL if absent); out of int32 range -> NULL
    ("turn_index", pa.int32()),     # model_turn; out of int32 range -> NULL
    ("latency_ms", pa.float64()),   # model_turn, tool_call
    ("output_text", pa.string()),   # model_turn
]

EVENTS_SCHEMA = pa.schema([
    ("event_id", pa.string()),
    ("type", pa.string()),
    ("schema_version", pa.int32()),
    ("app", pa.string()),
    ("task", pa.string()),
    ("trace_id", pa.string()),
    ("turn_id", pa.string()),
    ("event_time", TS),
    ("payload", pa.string()),
    ("kafka_topic", pa.string()),
    ("kafka_partition", pa.int32()),
    ("kafka_offset", pa.int64()),
    ("ingested_at", TS),
    ("run_id", pa.string()),
    *[pa.field(n, t) for n, t in HOT_COLUMNS],
])

QUARANTINE_SCHEMA = pa.schema([
    ("reason", pa.string()),
    ("error", pa.string()),
    ("raw_value", pa.binary()),
    ("raw_key", pa.binary()),
    ("kafka_topic", pa.string()),
    ("kafka_partition", pa.int32()),
    ("kafka_offset", pa.int64()),
    ("kafka_timestamp", TS),
    ("quarantined_at", TS),
    ("run_id", pa.string()),
])


class Columns:
    """Column-wise accumulator: appending to lists beats building row dicts."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.cols: dict[str, list] = {name: [] for name in schema.names}

    def __len__(self) -> int:
        return len(next(iter(self.cols.values())))

    def table(self) -> pa.Table:
        return pa.table({n: pa.array(v, type=self.schema.field(n).type) for n, v in self.cols.items()},
                        schema=self.schema)
