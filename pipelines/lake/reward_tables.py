"""The reward stage's Delta tables, committed together through a run log.

A reward run writes up to four tables: `rewards` (settled turns, append-only), `reward_corrections`
(append-only), and the open state, `reward_provisional` and `reward_pending` (a snapshot per run,
its `snapshot` partition the run's id). Delta commits one table at a time, so a run's row in
`reward_runs` is its commit point: appended after its data, carrying the application transaction
`tracerl/rewards` at the run's sequence number and checked against the snapshot of `reward_runs`
the run started from, so of two runs that started from one snapshot the second conflicts
(`delta.CommitConflict`). Readers take the committed runs first (`reward_state`), then only their
rows: settled rows and corrections whose `reward_run` is committed, and the open state of the
latest committed run. A run killed between its data commits and its row, or one that lost the
race, leaves rows no reader sees (they only take space).

The tables live wherever `[tables]` puts the others (`delta.Where`: the lake folder or an object
store), so reward runs need no host-local lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from pipelines.lake import delta
from pipelines.lake.tables import (
    CORRECTION_SCHEMA, CORRECTIONS, PENDING, PROVISIONAL, REWARD_RUNS, REWARD_SCHEMA, REWARDS, RUN_SCHEMA,
)

COMMIT_POINT = "tracerl/rewards"  # the application transaction on each run's row; its version: the run's seq


@dataclass
class RewardState:
    """What the committed reward runs have done, as of one snapshot of `reward_runs`."""
    runs: pa.Table = field(default_factory=RUN_SCHEMA.empty_table)  # one row per committed run
    base: object = delta.NO_TABLE        # that snapshot (a DeltaTable), what the next run commits against

    @property
    def latest(self) -> dict | None:
        if self.runs.num_rows == 0:
            return None
        import pyarrow.compute as pc

        return self.runs.slice(pc.index(self.runs["seq"], pc.max(self.runs["seq"])).as_py(), 1).to_pylist()[0]

    @property
    def seq(self) -> int:
        """The latest committed run's sequence number; 0 before any."""
        return self.latest["seq"] if self.latest else 0

    @property
    def run_id(self) -> str | None:
        return self.latest["run_id"] if self.latest else None

    @property
    def events_version(self) -> int:
        """Every `events` version up to here has been read (-1: none)."""
        return self.latest["events_version"] if self.latest else -1

    @property
    def events_read(self) -> set[str] | None:
        """The `events` files read so far (`delta.relative` paths); None where the latest run is of a
        release that did not record them (then only `events_version` says what was read)."""
        latest = self.latest
        if latest is None:
            return set()
        if latest["events_files"] is None:
            return None
        import pyarrow.compute as pc

        return set(pc.list_flatten(self.runs["events_files"]).to_pylist())


def reward_state(where: delta.Where) -> RewardState:
    table = delta.open_table(where, REWARD_RUNS)
    if table is None:
        for dataset in (REWARDS, CORRECTIONS, PROVISIONAL, PENDING):
            delta.check_layout(where, dataset)  # reward data of the manifest layout: migrate first
        return RewardState(RUN_SCHEMA.empty_table())
    runs = table.to_pyarrow_table()
    for f in RUN_SCHEMA:  # a column a later release added: null in the runs before it
        if f.name not in runs.column_names:
            runs = runs.append_column(f.name, pa.nulls(runs.num_rows, f.type))
    return RewardState(runs.select(RUN_SCHEMA.names).cast(RUN_SCHEMA), table)


def _runs(con: duckdb.DuckDBPyConnection, state: RewardState) -> str:
    con.register("_reward_runs", state.runs)
    return "_reward_runs"


_SQL_TYPES = {pa.string(): "VARCHAR", pa.float64(): "DOUBLE", pa.int64(): "BIGINT", pa.int32(): "INTEGER",
              pa.bool_(): "BOOLEAN", pa.date32(): "DATE"}


def _columns(con: duckdb.DuckDBPyConnection, src: str, schema: pa.Schema) -> str:
    """``schema``'s columns of ``src``; a column its files lack (a release before the column came:
    a new reward component, a new signal) reads NULL, so an old table or snapshot still binds."""
    have = {r[0] for r in con.sql(f"DESCRIBE SELECT * FROM {src}").fetchall()}
    return ", ".join(f.name if f.name in have else
                     f"NULL::{_SQL_TYPES.get(f.type, 'TIMESTAMPTZ' if pa.types.is_timestamp(f.type) else 'VARCHAR')}"
                     f" AS {f.name}" for f in schema)


def _committed(con: duckdb.DuckDBPyConnection, where: delta.Where, state: RewardState, dataset: str,
               schema: pa.Schema) -> str:
    """SQL relation of ``dataset``'s rows of committed runs, ``schema``'s columns."""
    names = ", ".join(f.name for f in schema)
    _, paths = delta.files(where, dataset)
    if not paths or state.runs.num_rows == 0:
        con.register(f"_empty_{dataset}", schema.empty_table())
        return f"(SELECT {names} FROM _empty_{dataset})"
    src = delta.scan(con, where, dataset, paths, f"_table_{dataset}")
    names = _columns(con, src, schema)
    return f"(SELECT {names} FROM {src} WHERE reward_run IN (SELECT run_id FROM {_runs(con, state)}))"


def _snapshot(con: duckdb.DuckDBPyConnection, where: delta.Where, state: RewardState, dataset: str,
              schema: pa.Schema) -> str:
    """SQL relation of the latest committed run's snapshot of ``dataset``, ``schema``'s columns."""
    names = ", ".join(f.name for f in schema)
    paths = delta.files(where, dataset, where=[("snapshot", "=", state.run_id)])[1] if state.run_id else []
    if not paths:
        con.register(f"_empty_{dataset}", schema.empty_table())
        return f"(SELECT {names} FROM _empty_{dataset})"
    src = delta.scan(con, where, dataset, paths, f"_table_{dataset}")
    return f"(SELECT {_columns(con, src, schema)} FROM {src})"


def settled(con: duckdb.DuckDBPyConnection, where: delta.Where, state: RewardState) -> str:
    """Settled turns, each once, of the committed runs."""
    return _committed(con, where, state, REWARDS, REWARD_SCHEMA)


def corrections(con: duckdb.DuckDBPyConnection, where: delta.Where, state: RewardState) -> str:
    return _committed(con, where, state, CORRECTIONS, CORRECTION_SCHEMA)


def provisional(con: duckdb.DuckDBPyConnection, where: delta.Where, state: RewardState) -> str:
    """Open turns as the latest committed run scored them."""
    return _snapshot(con, where, state, PROVISIONAL, REWARD_SCHEMA)


def pending(con: duckdb.DuckDBPyConnection, where: delta.Where, state: RewardState, schema: pa.Schema) -> str:
    """Signals the latest committed run left waiting (``schema``: the reward stage's signal schema)."""
    return _snapshot(con, where, state, PENDING, schema)


def commit(where: delta.Where, state: RewardState, run_id: str, events_version: int,
           rows: dict[str, pa.Table], events_files: list[str]) -> int:
    """Commit one run that started from ``state``: ``rows`` per dataset (each row already carrying
    ``reward_run`` = ``run_id``; the snapshots get their partition here), then its row in the run
    log, with ``events_files`` (`RewardState.events_read`). Its sequence number; `delta.CommitConflict`
    where another run committed since ``state`` (nothing of this one is read then)."""
    seq = state.seq + 1
    info = {"tracerl.run": run_id}
    for dataset in (REWARDS, CORRECTIONS, PROVISIONAL, PENDING):
        table = rows.get(dataset)
        if table is None or table.num_rows == 0:
            continue
        if dataset in (PROVISIONAL, PENDING):
            table = table.append_column("snapshot", pa.array([run_id] * table.num_rows, pa.string()))
        delta.append(where, dataset, table, info=info)
    counts = {k: (rows[d].num_rows if d in rows else 0) for k, d in
              (("settled", REWARDS), ("provisional", PROVISIONAL), ("corrections", CORRECTIONS), ("pending", PENDING))}
    run = pa.table({"run_id": [run_id], "seq": [seq], "events_version": [events_version],
                    "committed_at": [int(time.time() * 1e6)], **{k: [v] for k, v in counts.items()},
                    "events_files": [events_files]},
                   schema=RUN_SCHEMA)
    _commit_point(where, state, run, seq, info)
    return seq


def _commit_point(where: delta.Where, state: RewardState, run: pa.Table, seq: int, info: dict) -> None:
    delta.append(where, REWARD_RUNS, run, marks={COMMIT_POINT: seq}, base=state.base, info=info)


def record_rewrite(where: delta.Where, removed: set[str], added: set[str]) -> bool:
    """After a delete rewrote `events` files (`tracerl forget`): the files it wrote in place of
    ``removed`` (`delta.relative` paths) hold only rows of those, so where every removed file had been
    read, ``added`` is recorded as read too, in a run row without data that keeps the latest run's id
    (its open-state snapshot stays the current one). Else the reward stage would read those rows a
    second time as new, and correct turns it had settled. False where nothing was recorded: nothing
    added, a removed file not read yet (its rows are new to the reward stage either way), or a lake
    whose runs do not record their files."""
    for _ in range(5):
        state = reward_state(where)
        read = state.events_read
        if not added or read is None or not removed <= read or state.run_id is None:
            return False
        run = pa.table({"run_id": [state.run_id], "seq": [state.seq + 1], "events_version": [state.events_version],
                        "committed_at": [int(time.time() * 1e6)], "settled": [0], "provisional": [0],
                        "corrections": [0], "pending": [0], "events_files": [sorted(added)]}, schema=RUN_SCHEMA)
        try:
            _commit_point(where, state, run, state.seq + 1, {"tracerl.run": f"{state.run_id}/rewrite"})
            return True
        except delta.CommitConflict:  # a reward run committed meanwhile: look again
            continue
    raise delta.CommitConflict("reward runs kept committing while a rewrite of `events` was being recorded")


def drop_snapshots(where: delta.Where, keep: int) -> list[str]:
    """Remove the open-state snapshots of committed runs but the last ``keep`` (a reader mid-query
    still has its own); the run ids dropped. Their files go at the next `delta.vacuum`. A snapshot
    of a run not committed is left alone: it may be one in flight."""
    state = reward_state(where)
    # a run id once, at its last row (`record_rewrite` adds rows under the latest run's id)
    ordered = list(dict.fromkeys(r["run_id"] for r in sorted(state.runs.to_pylist(), key=lambda r: -r["seq"])))[::-1]
    old = set(ordered[:-keep] if keep else ordered)
    dropped: set[str] = set()
    for dataset in (PROVISIONAL, PENDING):
        table = delta.open_table(where, dataset)
        if table is None:
            continue
        present = {p["snapshot"] for p in table.partitions()}
        gone = sorted(present & old)
        if not gone:
            continue
        listed = ", ".join("'" + g.replace("'", "''") + "'" for g in gone)
        try:
            table.delete(f"snapshot IN ({listed})")
        except Exception:  # noqa: BLE001 - a concurrent commit touched it: the next run drops them
            continue
        dropped.update(gone)
    return sorted(dropped)
