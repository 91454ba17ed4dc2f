"""One incremental reward run: new lake events -> rewards, committed atomically.

State lives in the lake's own commit log, so it commits with the data or not
at all. A reward run's manifest records `reward_through_events_version`: every
`events` Delta version up to it has been read. A run therefore:

1. under the lake lock: recovers, finds the latest reward manifest;
2. reads only the `events` files added after that version (`delta.files`),
   plus the *pending* snapshot (signals of turns not yet settled, and orphan
   signals waiting for their turn) and, for the traces at hand, the settled-turn
   registry (the `rewards` dataset itself);
3. computes in DuckDB (`sql.py`);
4. under the lock again: checks no other reward run committed meanwhile, stages
   the settled rows (append-only, each turn exactly once), the corrections
   (append-only), new pending and provisional snapshots, commits the manifest,
   publishes, and drops snapshots older than the last `keep_snapshots` runs.

Datasets (lake root): `rewards/tenant=/date=/` settled turns (the learner reads
these, by `reward_seq`, exactly once); `reward_corrections/tenant=/date=/`
events that came after their turn settled, or never found their turn;
`reward_provisional/snapshot=<seq>/`, `reward_pending/snapshot=<seq>/`:
current open state, located through the latest reward manifest.
"""

from __future__ import annotations

import shutil
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
from pipelines.lake.store import Lake
from pipelines.lake.tables import (
    CORRECTIONS, PENDING, PROVISIONAL, REWARDS, STATE_KEY, RewardState, is_reward_manifest, reward_state,
)
from pipelines.reward.spec import SpecBook
from pipelines.reward.sql import DUPLICATE_IDS, SIGNAL_SCHEMA, TRACE, compute_sql, extract_sql, rewards_sql



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


def compute(lake_root: Path, new_files: list[str], state: RewardState, book: SpecBook,
            now: datetime, tables: TableStore | None = None) -> Computed:
    """The SQL part of a run; reads only, writes nothing. ``new_files``: of the events table in
    ``tables`` (None: the lake folder's)."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET preserve_insertion_order = false")  # row order is never relied on
    empty = SIGNAL_SCHEMA.empty_table()
    con.register("_empty_signals", empty)
    if new_files:
        events = delta.scan(con, tables or lake_root, EVENTS, new_files, "_new_events")
        con.execute(f"CREATE TEMP TABLE new_sig AS {extract_sql(events)}")
    else:
        con.execute("CREATE TEMP TABLE new_sig AS SELECT * FROM _empty_signals")
    pending = [str(lake_root / p) for p in state.files(PENDING)]
    src = f"read_parquet({pending!r}, hive_partitioning = false)" if pending else "_empty_signals"
    con.execute(f"CREATE TEMP TABLE pending AS SELECT * FROM {src}")
    reg_cols = "turn_id, trace_id, tenant, app, task, turn_index, turn_time"
    settled_files = list((lake_root / REWARDS).rglob("*.parquet"))
    if settled_files:
        # Settled turns of the traces at hand, by (tenant, trace): every signal names its turn in its trace.
        con.execute(f"""CREATE TEMP TABLE reg AS SELECT {reg_cols} FROM read_parquet(
                          '{lake_root / REWARDS}/**/*.parquet', hive_partitioning = true,
                          hive_types = {{'tenant': VARCHAR, 'date': DATE}}, union_by_name = true)
                        SEMI JOIN (SELECT {TRACE} FROM new_sig UNION SELECT {TRACE} FROM pending) k
                        USING ({TRACE})""")
    else:
        con.execute("""CREATE TEMP TABLE reg (turn_id VARCHAR, trace_id VARCHAR, tenant VARCHAR, app VARCHAR,
                       task VARCHAR, turn_index INTEGER, turn_time TIMESTAMPTZ)""")
    params = _param_table(con, book)
    con.register("params", params)
    dup_events, dup_turns = con.execute(DUPLICATE_IDS).fetchone()
    for stmt in compute_sql(now, dedupe=dup_events > 0, dedupe_turns=dup_events + dup_turns > 0):
        con.execute(stmt)
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
    )
    con.close()
    return out


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


def _stage_partitioned(txn, dataset: str, table: pa.Table, files: list[str]) -> None:
    """One file per (tenant, date); those two live in the folder names, as in `events`."""
    if table.num_rows == 0:
        return
    keys = pa.table({"tenant": table["tenant"], "date": table["date"]}).group_by(["tenant", "date"]).aggregate([])
    for tenant, day in zip(keys["tenant"].to_pylist(), keys["date"].to_pylist()):
        mask = pc.and_(pc.equal(table["tenant"], tenant), pc.equal(table["date"], pa.scalar(day, pa.date32())))
        part = table.filter(mask).drop_columns(["tenant", "date"])
        files.append(txn.stage(dataset, {"tenant": tenant, "date": day.isoformat()}, part))


def run_rewards(lake_root: str | Path, book: SpecBook | None = None, now: datetime | None = None,
                run_id: str | None = None, keep_snapshots: int = 2,
                tables: TableStore | None = None) -> RewardRunResult:
    """Process what is new since the last reward run; commit atomically. `now` defaults to wall
    clock. ``tables``: where the events table is (`TracerlConfig.table_store`); None = the lake folder."""
    started = time.monotonic()
    root = Path(lake_root).resolve()
    book = book or SpecBook()
    now = now or datetime.now(timezone.utc)
    result = RewardRunResult(run_id=run_id or "reward-" + time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8])
    lake = Lake(root)
    with lake.locked():
        lake.recover()
        state = reward_state(lake.manifests())
    result.events_version, new_files = delta.files(tables or root, EVENTS, after=state.events_version)
    result.new_files = len(new_files)

    t0 = time.monotonic()
    out = compute(root, new_files, state, book, now, tables)
    result.compute_seconds = time.monotonic() - t0
    result.tables, result.new_signals = out, out.new_signals
    result.settled, result.provisional = out.settled.num_rows, out.provisional.num_rows
    result.settled_unlabelled = out.settled.num_rows - pc.sum(out.settled["labelled"]).as_py() \
        if out.settled.num_rows else 0
    result.pending_signals, result.orphans_pending = out.pending.num_rows, out.orphans_pending
    result.spec_versions = out.spec_versions
    for reason in out.corrections["reason"].to_pylist():
        result.corrections[reason] = result.corrections.get(reason, 0) + 1
    if not new_files and not out.settled.num_rows and not out.corrections.num_rows:
        result.seconds = time.monotonic() - started
        return result  # nothing changed: no commit, no new snapshot

    with lake.locked():
        lake.recover()
        latest = reward_state(lake.manifests()).manifest
        if (latest.seq if latest else None) != (state.manifest.seq if state.manifest else None):
            raise ConcurrentRewardRun(f"reward run {latest.run_id} committed while {result.run_id} was computing; "
                                      "nothing was written: run again")
        txn = lake.begin(result.run_id)
        result.seq = txn.seq
        files: list[str] = []
        computed_at = datetime.now(timezone.utc)

        def stamp(t: pa.Table) -> pa.Table:
            n = t.num_rows
            return (t.append_column("reward_seq", pa.array([txn.seq] * n, pa.int64()))
                     .append_column("reward_run", pa.array([result.run_id] * n, pa.string()))
                     .append_column("computed_at", pa.array([computed_at] * n, pa.timestamp("us", tz="UTC"))))

        _stage_partitioned(txn, REWARDS, stamp(out.settled), files)
        corrections = out.corrections.append_column(
            "reward_seq", pa.array([txn.seq] * out.corrections.num_rows, pa.int64()))
        _stage_partitioned(txn, CORRECTIONS, corrections, files)
        snap = {"snapshot": f"{txn.seq:012d}"}
        if out.provisional.num_rows:
            files.append(txn.stage(PROVISIONAL, snap, stamp(out.provisional)))
        if out.pending.num_rows:
            files.append(txn.stage(PENDING, snap, out.pending))
        txn.commit({}, {STATE_KEY: result.events_version, "reward_settled": out.settled.num_rows,
                        "reward_provisional": out.provisional.num_rows,
                        "reward_corrections": out.corrections.num_rows, "reward_pending": out.pending.num_rows})
        txn.publish()
        result.committed = True
        _drop_old_snapshots(lake, keep_snapshots)
    result.seconds = time.monotonic() - started
    return result


def _drop_old_snapshots(lake: Lake, keep: int) -> None:
    """Open-state snapshots are replaced each run; keep the last few for readers mid-query."""
    recent = [m for m in lake.manifests() if is_reward_manifest(m)][-keep:]
    live = {f"snapshot={m.seq:012d}" for m in recent}
    for dataset in (PENDING, PROVISIONAL):
        folder = lake.dataset(dataset)
        if folder.exists():
            for d in folder.iterdir():
                if d.name not in live:
                    shutil.rmtree(d, ignore_errors=True)
