"""Health checks of a reward run, as plain data (the asset turns them into Dagster checks).

- unlabelled_share: most turns carry no signal in any product; a share near 1
  means feedback stopped arriving (a broken client) or labels are being lost.
- reward_bounds: every component on [-1, 1], every total within the spec's
  bound, and `labelled` <=> total not NULL. A violation is a bug or malformed
  input that would go straight into gradients: ERROR, and the check blocks.
- component_drift: each component's mean (and the labelled / dodge rates) in
  this run's settled turns against the pooled mean of the previous runs. A
  sudden jump is the classic sign of reward hacking (e.g. the policy learned
  to dodge with questions, or to emit broken tool calls) or of a client that
  started sending garbage; it fails as WARN, or ERROR past the hard limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from pipelines.lake import delta, reward_tables
from pipelines.lake.tables import COMPONENTS
from pipelines.reward.engine import RewardRunResult
from pipelines.reward.spec import SpecBook


@dataclass
class CheckLimits:
    max_unlabelled_share: float = 0.9    # of the turns settled in one run
    drift_warn: float = 0.25             # |mean now - mean before| of a component on [-1, 1]
    drift_error: float = 0.5
    rate_warn: float = 0.15              # same, for the labelled and dodge rates (shares on [0, 1])
    rate_error: float = 0.3
    drift_min_rows: int = 50             # fewer non-null values (now or before): not judged
    drift_history_runs: int = 10         # the baseline pools this many previous reward runs


@dataclass
class CheckOutcome:
    name: str
    passed: bool
    severity: str                        # "WARN" or "ERROR": how bad a failure is
    metadata: dict[str, Any] = field(default_factory=dict)


UNLABELLED, BOUNDS, DRIFT = "unlabelled_share", "reward_bounds", "component_drift"
_RATES = ("labelled_rate", "dodge_rate")


def unlabelled_share(settled: pa.Table, limits: CheckLimits) -> CheckOutcome:
    n = settled.num_rows
    unlabelled = n - sum(bool(x) for x in settled["labelled"].to_pylist()) if n else 0
    share = unlabelled / n if n else 0.0
    return CheckOutcome(UNLABELLED, share <= limits.max_unlabelled_share, "WARN",
                        {"settled_turns": n, "unlabelled_turns": unlabelled, "unlabelled_share": round(share, 4),
                         "limit": limits.max_unlabelled_share})


def reward_bounds(tables: list[pa.Table], book: SpecBook) -> CheckOutcome:
    rows = pa.concat_tables([t.select(["turn_id", "tenant", "task", "labelled", "total", *COMPONENTS])
                             for t in tables]) if tables else None
    if rows is None or rows.num_rows == 0:
        return CheckOutcome(BOUNDS, True, "ERROR", {"rows_checked": 0})
    pairs = {(t, k) for t, k in zip(rows["tenant"].to_pylist(), rows["task"].to_pylist())}
    bounds = pa.table({"tenant": [t for t, _ in pairs], "task_key": [k or "" for _, k in pairs],
                       "bound": [book.resolve(t, k).total_bound + 1e-9 for t, k in pairs]})
    con = duckdb.connect()
    con.register("r", rows)
    con.register("b", bounds)
    checks = {c: f"{c} IS NOT NULL AND NOT (isfinite({c}) AND abs({c}) <= 1 + 1e-9)" for c in COMPONENTS}
    checks["total"] = "total IS NOT NULL AND NOT (isfinite(total) AND abs(total) <= bound)"
    checks["labelled"] = "(total IS NOT NULL) <> labelled"
    cond = " OR ".join(f"({v})" for v in checks.values())
    counts = con.sql(f"SELECT {', '.join(f'count(*) FILTER (WHERE {v}) AS {k}' for k, v in checks.items())} "
                     "FROM r JOIN b ON b.tenant = r.tenant AND b.task_key = coalesce(r.task, '')").fetchall()[0]
    examples = [x for (x,) in con.sql(f"SELECT turn_id FROM r JOIN b ON b.tenant = r.tenant "
                                      f"AND b.task_key = coalesce(r.task, '') WHERE {cond} LIMIT 5").fetchall()]
    con.close()
    bad = {k: n for k, n in zip(checks, counts) if n}
    return CheckOutcome(BOUNDS, not bad, "ERROR", {"violations": bad, "examples": examples,
                                                   "rows_checked": rows.num_rows})


def _run_stats(con: duckdb.DuckDBPyConnection, source: str) -> str:
    comps = ", ".join(f"sum({c})::DOUBLE AS {c}_sum, count({c}) AS {c}_n" for c in [*COMPONENTS, "total"])
    return (f"SELECT {comps}, sum(labelled::INT)::DOUBLE AS labelled_rate_sum, count(*) AS labelled_rate_n, "
            f"sum((dodge IS NOT NULL)::INT)::DOUBLE AS dodge_rate_sum, count(*) AS dodge_rate_n FROM {source}")


def component_drift(where: delta.Where, result: RewardRunResult, limits: CheckLimits) -> CheckOutcome:
    settled = result.tables.settled if result.tables else None
    if settled is None or settled.num_rows == 0:
        return CheckOutcome(DRIFT, True, "WARN", {"note": "no turns settled in this run"})
    con = duckdb.connect()
    con.register("now_rows", settled)
    now = con.sql(_run_stats(con, "now_rows")).to_arrow_table().to_pylist()[0]
    rows = reward_tables.settled(con, where, reward_tables.reward_state(where))
    con.execute(f"CREATE TEMP TABLE history AS SELECT * FROM {rows} WHERE reward_seq IN (SELECT DISTINCT "
                f"reward_seq FROM {rows} WHERE reward_seq < {result.seq or 2**62} ORDER BY reward_seq DESC "
                f"LIMIT {limits.drift_history_runs})")
    before: dict[str, Any] = con.sql(_run_stats(con, "history")).to_arrow_table().to_pylist()[0]
    con.close()
    drift: dict[str, dict[str, float]] = {}
    worst = "ok"
    for name in [*COMPONENTS, "total", *_RATES]:
        n_now, n_before = now[f"{name}_n"] or 0, before.get(f"{name}_n") or 0
        if n_now < limits.drift_min_rows or n_before < limits.drift_min_rows:
            continue
        m_now, m_before = now[f"{name}_sum"] / n_now, before[f"{name}_sum"] / n_before
        d = abs(m_now - m_before)
        warn, err = (limits.rate_warn, limits.rate_error) if name in _RATES else (limits.drift_warn, limits.drift_error)
        level = "error" if d > err else "warn" if d > warn else "ok"
        drift[name] = {"now": round(m_now, 4), "before": round(m_before, 4), "drift": round(d, 4), "level": level}
        if level == "error" or (level == "warn" and worst == "ok"):
            worst = level
    flagged = sorted(k for k, v in drift.items() if v["level"] != "ok")
    return CheckOutcome(DRIFT, worst == "ok", "ERROR" if worst == "error" else "WARN",
                        {"flagged": flagged, "components": drift, "judged": len(drift),
                         "history_runs": limits.drift_history_runs})


def evaluate(where: delta.Where, result: RewardRunResult, book: SpecBook,
             limits: CheckLimits | None = None) -> list[CheckOutcome]:
    limits = limits or CheckLimits()
    tables = [result.tables.settled, result.tables.provisional] if result.tables else []
    settled = result.tables.settled if result.tables else pa.table({"labelled": pa.array([], pa.bool_())})
    return [unlabelled_share(settled, limits), reward_bounds(tables, book),
            component_drift(where, result, limits)]
