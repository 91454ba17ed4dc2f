"""Arrow schemas of every lake dataset (events, quarantine, rewards, corrections, the
trained-turns ledger), the reward datasets' names and snapshot state, and rows -> tables.

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
of format-1 files only does not bind; re-ingest it from Kafka. `user_text` came
after format 2: files without it read NULL (the reward stage checks the columns
it reads: `reward/engine.py`), so no re-ingest is needed for it; so did `user_id` (the event's
`user` as a pseudonym, docs/privacy.md), which the views read NULL where a lake has no file with it.
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
    ("user_text", pa.string()),     # model_turn: the last user message of input_messages (hindsight
                                    # signals read it); added later: older files read NULL
    ("user_id", pa.string()),       # every type: the event's `user`, always a pseudonym (u_ + 32 hex:
                                    # ingest pseudonymizes a clear one); added later: older files read NULL
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


# --- The reward stage's datasets (written by `pipelines/reward/engine.py`) ---
REWARDS = "rewards"                    # settled turns, append-only: tenant=/date=/
CORRECTIONS = "reward_corrections"     # events after their turn settled, or that never found it
PROVISIONAL = "reward_provisional"     # snapshot=<run>/: open turns as of each run
PENDING = "reward_pending"             # snapshot=<run>/: signals waiting for their turn to settle
REWARD_RUNS = "reward_runs"            # one row per committed reward run: the commit point (`reward_tables.py`)
# Before the reward datasets were Delta tables (`migrate.py` reads these from the old manifests):
STATE_KEY = "reward_through_events_version"  # a reward manifest's count: every events version up to it was read
OLD_STATE_KEY = "reward_through_seq"   # before the events table was Delta: every manifest up to it

# Component columns of the rewards dataset, in order (`pipelines/reward/spec.py` weighs them).
# `hindsight` came last (older reward files read NULL in it: `reward_tables._committed`).
COMPONENTS = ("thumbs", "rating", "output", "regenerate", "follow_up",
              "abandon", "session", "tool", "retries", "latency", "length", "hindsight")

TS_US = pa.timestamp("us", tz="UTC")  # the reward datasets' time unit
REWARD_SCHEMA = pa.schema(
    [("tenant", pa.string()), ("date", pa.date32()), ("app", pa.string()), ("task", pa.string()),
     ("trace_id", pa.string()), ("turn_id", pa.string()), ("turn_index", pa.int32()), ("turn_time", TS_US)]
    + [(c, pa.float64()) for c in COMPONENTS]
    + [("dodge", pa.string()), ("labelled", pa.bool_()), ("total", pa.float64()), ("settled", pa.bool_()),
       ("settle_at", TS_US), ("settle_reason", pa.string()), ("spec_version", pa.string()),
       ("reward_seq", pa.int64()), ("reward_run", pa.string()), ("computed_at", TS_US)])
CORRECTION_SCHEMA = pa.schema([
    ("tenant", pa.string()), ("date", pa.date32()), ("event_id", pa.string()), ("event_type", pa.string()),
    ("kind", pa.string()), ("app", pa.string()), ("task", pa.string()), ("trace_id", pa.string()),
    ("turn_id", pa.string()), ("event_time", TS_US), ("reason", pa.string()), ("component", pa.string()),
    ("value", pa.float64()), ("spec_version", pa.string()), ("reward_seq", pa.int64())])
# The run log: one row per committed reward run, appended last (`reward_tables.py`).
# `events_files`: the events table's files the run read (`delta.relative` paths), so the next run
# finds what is new without the log of `events_version` (Delta drops it after 30 days); null in
# runs of a release before it, and the first run after those records every file it has read.
RUN_SCHEMA = pa.schema([("run_id", pa.string()), ("seq", pa.int64()), ("events_version", pa.int64()),
                        ("committed_at", TS_US), ("settled", pa.int64()), ("provisional", pa.int64()),
                        ("corrections", pa.int64()), ("pending", pa.int64()),
                        ("events_files", pa.list_(pa.string()))])

# --- The learner's trained-turns ledger (`pipelines/lake/ledger.py`) ---
# `use`: 1 = the turn's first training, k = its k-th (replay); 0 = excluded eval prompt.
# `weight`: the replay age weight it trained with (1 = first use). Ledger files written before
# these columns lack them (read with union_by_name); use counts are row counts, not `use`.
LEDGER_SCHEMA = pa.schema([("task", pa.string()), ("turn_id", pa.string()),
                           ("adapter_version", pa.int64()), ("trained_at", pa.timestamp("ms", tz="UTC")),
                           ("use", pa.int64()), ("weight", pa.float64())])

# --- Reference logprobs (`pipelines/lake/reference.py`) ---
# log π_base of each output token of a turn, as the learner's reference forward computes it: a
# property of (turn ids, base model, forward precision) that never changes, so computed once.
REFERENCE_SCHEMA = pa.schema([("task", pa.string()), ("turn_id", pa.string()),
                              ("base_model_hash", pa.string()), ("precision", pa.string()),
                              ("ids_digest", pa.string()), ("logprobs", pa.list_(pa.float32())),
                              ("computed_at", pa.timestamp("ms", tz="UTC"))])
