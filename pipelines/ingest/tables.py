"""Arrow schemas of the landed datasets, and rows -> tables.

`events` keeps typed envelope columns for partition pruning and joins, plus
`payload`: the event's JSON exactly as the producer sent it. Keeping the raw
JSON means a field added by a newer producer survives ingest untouched; the
DuckDB views (`pipelines/lake/query.py`) give each event type typed columns.
`tenant` and `date` are not stored in the files: they are hive partitions.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("ms", tz="UTC")

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
