"""One incremental reward run: new lake events -> rewards, committed atomically.

State lives in the reward run log (`lake/reward_tables.py`), so it commits with the data or not at
all. A run's row there records `events_version`: every `events` Delta version up to it has been
read. A run therefore:

1. reads the committed runs (`reward_state`), and only the `events` files added after the latest
   one's version (`delta.files`), plus the *pending* snapshot (signals of turns not yet settled,
   and orphan signals waiting for their turn) and, for the traces at hand, the settled-turn
   registry (the `rewards` table itself);
2. computes in DuckDB (`sql.py`);
3. appends the settled rows (each turn exactly once), the corrections, and new pending and
   provisional snapshots, then its row in the run log, the commit point: a run that committed
   meanwhile makes this one fail with nothing of it read (`ConcurrentRewardRun`);
4. drops the snapshots older than the last `keep_snapshots` runs.

Tables (where `[tables]` puts them): `rewards` (tenant, date) settled turns (the learner reads
these, by `reward_seq`, exactly once); `reward_corrections` (tenant, date) events that came after
their turn settled, or never found their turn; `reward_provisional`, `reward_pending` (snapshot):
the current open state.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.config.tables import TableStore
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS
from pipelines.lake import reward_tables
from pipelines.lake.reward_tables import RewardState, reward_state
from pipelines.lake.tables import CORRECTIONS, PENDING, PROVISIONAL, REWARDS
from pipelines.reward import hindsight
from pipelines.reward.spec import SpecBook
from pipelines.reward.sql import (
    DUPLICATE_IDS, HINDSIGHT_SCHEMA, SIGNAL_SCHEMA, TRACE, TURN, compute_sql, extract_sql, rewards_sql,
)

log = logging.getLogger("tracerl.reward.hindsight")



class ConcurrentRewardRun(RuntimeError):
    pass


@dataclass
class Computed:
    settled: pa.Table
    provisional: pa.Table
    corrections: pa.Table
    pending: pa.Table
    new_signals: int
    orphans_pending: int
    spec_versions: list[str]
    # hindsight kind (and `all`) -> its agreement with the explicit votes on the turns settled in
    # this run that have both (`hindsight.calibrate`)
    hindsight_calibration: dict[str, hindsight.Agreement] = field(default_factory=dict)


def _param_table(con: duckdb.DuckDBPyConnection, book: SpecBook) -> pa.Table:
    pairs = con.sql("""SELECT DISTINCT tenant, coalesce(task, '') FROM (
                         SELECT tenant, task FROM new_sig UNION ALL SELECT tenant, task FROM pending
                         UNION ALL SELECT tenant, task FROM reg) ORDER BY ALL""").fetchall()
    rows = [{"tenant": t, "task_key": k, **book.resolve(t, k or None).params()} for t, k in pairs]
    template = {"tenant": "", "task_key": "", **book.resolve("*", None).params()}
    types = {k: pa.string() if isinstance(v, str) else pa.int64() if isinstance(v, int) else pa.float64()
             for k, v in template.items()}
    types["dodge_cap"] = pa.float64()
    return pa.table({k: pa.array([r[k] for r in rows], t) for k, t in types.items()})


def compute(where: delta.Where, new_files: list[str], state: RewardState, book: SpecBook,
            now: datetime) -> Computed:
    """The SQL part of a run; reads only, writes nothing. ``new_files``: of the events table in
    ``where`` (the lake folder or `TracerlConfig.table_store`)."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET preserve_insertion_order = false")  # row order is never relied on
    con.register("_empty_signals", SIGNAL_SCHEMA.empty_table())
    if new_files:
        events = delta.scan(con, where, EVENTS, new_files, "_new_events")
        has_user_text = "user_text" in {r[0] for r in con.sql(f"DESCRIBE SELECT * FROM {events}").fetchall()}
        con.execute(f"CREATE TEMP TABLE new_sig AS {extract_sql(events, user_text=has_user_text)}")
    else:
        con.execute("CREATE TEMP TABLE new_sig AS SELECT * FROM _empty_signals")
    con.execute(f"CREATE TEMP TABLE pending AS SELECT * FROM {reward_tables.pending(con, where, state, SIGNAL_SCHEMA)}")
    reg_cols = "turn_id, trace_id, tenant, app, task, turn_index, turn_time"
    # Settled turns of the traces at hand, by (tenant, trace): every signal names its turn in its trace.
    con.execute(f"""CREATE TEMP TABLE reg AS SELECT {reg_cols} FROM {reward_tables.settled(con, where, state)}
                    SEMI JOIN (SELECT {TRACE} FROM new_sig UNION SELECT {TRACE} FROM pending) k
                    USING ({TRACE})""")
    signals = _hindsight(con)
    params = _param_table(con, book)
    con.register("params", params)
    dup_events, dup_turns = con.execute(DUPLICATE_IDS).fetchone()
    for stmt in compute_sql(now, dedupe=dup_events > 0, dedupe_turns=dup_events + dup_turns > 0):
        con.execute(stmt)
    calibration = _calibrate(con, signals, book)
    out = Computed(
        settled=con.sql(rewards_sql("settled")).to_arrow_table(),
        provisional=con.sql(rewards_sql("provisional")).to_arrow_table(),
        corrections=con.sql("SELECT *, (event_time AT TIME ZONE 'UTC')::DATE AS date FROM corrections "
                            "ORDER BY tenant, event_time, event_id, turn_id, component").to_arrow_table(),
        pending=con.sql(f"SELECT {', '.join(SIGNAL_SCHEMA.names)} FROM next_pending ORDER BY event_id")
                   .to_arrow_table().cast(SIGNAL_SCHEMA),
        new_signals=con.execute("SELECT count(*) FROM new_sig").fetchone()[0],
        orphans_pending=con.execute("SELECT count(*) FROM orphan WHERE NOT expired").fetchone()[0],
        spec_versions=sorted(set(params.column("spec_version").to_pylist())),
        hindsight_calibration=calibration,
    )
    con.close()
    return out


def _hindsight(con: duckdb.DuckDBPyConnection) -> dict[tuple, hindsight.Hindsight]:
    """Between extract and compute: each open model turn paired with the next turn of its trace
    (`hindsight.next_turn_hindsight`, over the first arrival of each turn among the pending and new
    signals, as `turns0` takes it), registered as ``hs`` for `compute_sql`. Python, not SQL: the
    classifier reads text. A turn waits for its next turn while it is open (its signal stays
    pending, so a later run pairs it); one that settles without one gets no hindsight."""
    rows = con.sql(f"""WITH m AS (
          SELECT tenant, trace_id, turn_id, turn_index, event_time, ingested_at, event_id, user_text, out_text
          FROM (SELECT * FROM pending UNION ALL BY NAME SELECT * FROM new_sig)
          WHERE type = 'model_turn' AND turn_id IS NOT NULL AND turn_index IS NOT NULL)
        SELECT tenant, trace_id, turn_id, turn_index, event_time AS turn_time, user_text, out_text
        FROM m SEMI JOIN (SELECT {TRACE} FROM m GROUP BY ALL HAVING count(DISTINCT turn_id) > 1) k USING ({TRACE})
        QUALIFY row_number() OVER (PARTITION BY {TURN} ORDER BY ingested_at, event_id) = 1""").fetchall()
    names = ("tenant", "trace_id", "turn_id", "turn_index", "turn_time", "user_text", "out_text")
    signals = hindsight.next_turn_hindsight(dict(zip(names, r)) for r in rows)
    keys = list(signals)
    con.register("hs", pa.table({
        "tenant": [k[0] for k in keys], "trace_id": [k[1] for k in keys], "turn_id": [k[2] for k in keys],
        "hs_kind": [signals[k].kind for k in keys], "hs_conf": [signals[k].confidence for k in keys]},
        schema=HINDSIGHT_SCHEMA))
    return signals


def _calibrate(con: duckdb.DuckDBPyConnection, signals: dict[tuple, hindsight.Hindsight],
               book: SpecBook) -> dict[str, hindsight.Agreement]:
    """Hindsight against the explicit votes (thumbs, else the rating's sign) of the turns settled in
    this run that have both; logged when any turn has both."""
    if not signals:
        return {}
    votes = {(t, tr, u): v for t, tr, u, v in con.sql(
        "SELECT tenant, trace_id, turn_id, coalesce(thumbs, sign(rating)) FROM rw "
        "WHERE settled_now AND coalesce(thumbs, sign(rating), 0) <> 0").fetchall()}
    spec = book.resolve("*", None)
    result = hindsight.calibrate({k: signals[k] for k in votes if k in signals}, votes,
                                 min_confidence=spec.hindsight.min_confidence, thumbs_weight=spec.weights.thumbs)
    if result["all"].count:
        hindsight.log_calibration(result, log)
    return result


@dataclass
class RewardRunResult:
    run_id: str
    seq: int | None = None               # the lake sequence number of this run's commit
    committed: bool = False
    new_files: int = 0
    new_signals: int = 0
    settled: int = 0
    settled_unlabelled: int = 0
    provisional: int = 0
    pending_signals: int = 0
    orphans_pending: int = 0
    corrections: dict[str, int] = field(default_factory=dict)
    spec_versions: list[str] = field(default_factory=list)
    events_version: int = -1             # every events version up to here is read (-1: none)
    compute_seconds: float = 0.0
    seconds: float = 0.0
    tables: Computed | None = None       # this run's outputs, for checks and tests
    # hindsight kind (and `all`) -> `hindsight.Agreement` with the explicit votes, on the turns settled
    # in this run that have both (empty when no open turn of the run had a next turn; counts of 0 when
    # none of those settled with a vote)
    hindsight_calibration: dict[str, hindsight.Agreement] = field(default_factory=dict)


def run_rewards(lake_root: str | Path, book: SpecBook | None = None, now: datetime | None = None,
                run_id: str | None = None, keep_snapshots: int = 2,
                tables: TableStore | None = None) -> RewardRunResult:
    """Process what is new since the last reward run; commit atomically. `now` defaults to wall
    clock. ``tables``: where the tables are (`TracerlConfig.table_store`); None = the lake folder."""
    started = time.monotonic()
    where = tables or Path(lake_root).resolve()
    book = book or SpecBook()
    now = now or datetime.now(timezone.utc)
    result = RewardRunResult(run_id=run_id or "reward-" + time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8])
    state = reward_state(where)
    read = state.events_read
    result.events_version, new_files, every_file = delta.files_since(where, EVENTS, read, state.events_version)
    result.new_files = len(new_files)

    t0 = time.monotonic()
    out = compute(where, new_files, state, book, now)
    result.compute_seconds = time.monotonic() - t0
    result.tables, result.new_signals = out, out.new_signals
    result.settled, result.provisional = out.settled.num_rows, out.provisional.num_rows
    result.settled_unlabelled = out.settled.num_rows - pc.sum(out.settled["labelled"]).as_py() \
        if out.settled.num_rows else 0
    result.pending_signals, result.orphans_pending = out.pending.num_rows, out.orphans_pending
    result.spec_versions = out.spec_versions
    result.hindsight_calibration = out.hindsight_calibration
    for reason in out.corrections["reason"].to_pylist():
        result.corrections[reason] = result.corrections.get(reason, 0) + 1
    if not new_files and not out.settled.num_rows and not out.corrections.num_rows:
        result.seconds = time.monotonic() - started
        return result  # nothing changed: no commit, no new snapshot

    seq, computed_at = state.seq + 1, datetime.now(timezone.utc)

    def stamp(t: pa.Table, *, when: bool = True) -> pa.Table:
        n = t.num_rows
        t = (t.append_column("reward_seq", pa.array([seq] * n, pa.int64()))
              .append_column("reward_run", pa.array([result.run_id] * n, pa.string())))
        return t.append_column("computed_at", pa.array([computed_at] * n, pa.timestamp("us", tz="UTC"))) if when else t

    rows = {REWARDS: stamp(out.settled), CORRECTIONS: stamp(out.corrections, when=False),
            PROVISIONAL: stamp(out.provisional), PENDING: out.pending}
    try:
        recorded = every_file if read is None else delta.relative(where, EVENTS, new_files)
        result.seq = reward_tables.commit(where, state, result.run_id, result.events_version, rows, recorded)
    except delta.CommitConflict:
        raise ConcurrentRewardRun(f"a reward run committed while {result.run_id} was computing; "
                                  "nothing of it is read: run again") from None
    result.committed = True
    reward_tables.drop_snapshots(where, keep_snapshots)
    result.seconds = time.monotonic() - started
    return result
