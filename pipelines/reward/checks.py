"""Health checks of a reward run, as plain data (the asset turns them into Dagster checks).

- unlabelled_share: most turns carry no signal in any product; a share near 1
  means feedback stopped arriving (a broken client) or labels are being lost.
- reward_bounds: every component on [-1, 1], every total within the spec's
  bound, and `labelled` <=> total not NULL. A violation is a bug or malformed
  input that would go straight into gradients: ERROR, and the check blocks.
- component_drift: each component's mean (and the labelled / dodge rates) in
  this run's settled turns against the pooled mean of the previous runs. A
  component moves for one of two reasons: the served model changed (a promoted
  adapter), and then the users' explicit votes move with it; or the reward
  stopped measuring what users want (reward hacking: the policy learned to
  dodge, to game tool outcomes; or a client sending garbage), and then the votes
  stay put. So a move the votes explain (same way, by at least `votes_share` of
  it, beyond their noise) passes, shown as information: a check red whenever
  the model improves would teach operators to ignore red. A move they do not
  explain fails: ERROR past the hard limit once the votes are measured, WARN
  when too few or too noisy votes cannot tell. The votes themselves (thumbs,
  rating) are the reference: shown, and only their fall past the hard limit
  warns (a worse model, or a broken vote client). The rates are judged alone.
"""

from __future__ import annotations

import math
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
    drift_warn: float = 0.25             # |mean now - mean before| of a component on [-1, 1]: it moved
    drift_error: float = 0.5             # a move past this that the votes do not explain: ERROR
    rate_warn: float = 0.15              # same, for the labelled and dodge rates (shares on [0, 1])
    rate_error: float = 0.3
    drift_min_rows: int = 50             # fewer non-null values (now or before): not judged
    drift_history_runs: int = 10         # the baseline pools this many previous reward runs
    votes_min_rows: int = 20             # fewer explicit votes (now or before): they cannot tell; a move WARNs
    votes_share: float = 0.25            # the votes explain a move when they moved the same way by at least
                                         # this share of it (a signal driven only by what users like moves
                                         # no more than the votes: 1; the rest is room for noise and scale)
    votes_z: float = 2.0                 # the votes' move is known to within this many standard errors (~95 %)


@dataclass
class CheckOutcome:
    name: str
    passed: bool
    severity: str                        # "WARN" or "ERROR": how bad a failure is
    metadata: dict[str, Any] = field(default_factory=dict)


UNLABELLED, BOUNDS, DRIFT = "unlabelled_share", "reward_bounds", "component_drift"
_RATES = ("labelled_rate", "dodge_rate")
_VOTES = ("thumbs", "rating")            # the explicit components: the users' own verdict, the reference
VOTE = "coalesce(thumbs, sign(rating))"  # a turn's vote, as calibration takes it: thumbs, else the rating's sign


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
            f"sum((dodge IS NOT NULL)::INT)::DOUBLE AS dodge_rate_sum, count(*) AS dodge_rate_n, "
            f"sum({VOTE})::DOUBLE AS votes_sum, sum({VOTE} * {VOTE})::DOUBLE AS votes_sq, "
            f"count({VOTE}) AS votes_n FROM {source}")


@dataclass(frozen=True)
class Votes:
    """The explicit votes' mean now and before (None: no vote), with the standard error of the move."""
    now: float | None
    before: float | None
    se: float
    rows_now: int
    rows_before: int

    @property
    def move(self) -> float | None:
        return None if self.now is None or self.before is None else self.now - self.before

    @classmethod
    def of(cls, now: dict[str, Any], before: dict[str, Any]) -> Votes:
        def mean_var(s: dict[str, Any]) -> tuple[float | None, float, int]:
            n = s.get("votes_n") or 0
            if not n:
                return None, 0.0, 0
            m = s["votes_sum"] / n
            return m, max(s["votes_sq"] - n * m * m, 0.0) / max(n - 1, 1), n
        (m1, v1, n1), (m0, v0, n0) = mean_var(now), mean_var(before)
        se = math.sqrt(v1 / n1 + v0 / n0) if n1 and n0 else math.inf
        return cls(m1, m0, se, n1, n0)


EXPLAINED, UNEXPLAINED, UNKNOWN = "explained", "unexplained", "unknown"


def verdict(move: float, votes: Votes, limits: CheckLimits) -> str:
    """Do the votes explain a component's `move` (mean now - before)? `explained` when their move,
    less `votes_z` standard errors, still goes the same way by at least `votes_share` of it;
    `unexplained` when even their move plus `votes_z` standard errors falls short of that (flat,
    opposite, or too small); `unknown` in between, or with fewer than `votes_min_rows` votes."""
    if min(votes.rows_now, votes.rows_before) < limits.votes_min_rows or votes.move is None:
        return UNKNOWN
    along = math.copysign(1.0, move) * votes.move     # the votes' move in the component's direction
    need, slack = limits.votes_share * abs(move), limits.votes_z * votes.se
    return EXPLAINED if along - slack >= need else UNEXPLAINED if along + slack < need else UNKNOWN


def level(name: str, move: float, votes: Votes, limits: CheckLimits) -> str:
    """`ok` (did not move), `votes` (an explicit component: the reference itself), `explained`, or
    what a failure would be: `warn` / `error`. Rates are judged alone: no vote explains a client that
    stopped sending feedback, or a policy that learned to dodge. The votes themselves falling past
    the hard limit warn: a worse model got through, or the vote client broke."""
    rate = name in _RATES
    warn, err = (limits.rate_warn, limits.rate_error) if rate else (limits.drift_warn, limits.drift_error)
    if abs(move) <= warn:
        return "ok"
    if rate:
        return "error" if abs(move) > err else "warn"
    if name in _VOTES:
        return "warn" if move < -err else "votes"
    v = verdict(move, votes, limits)
    return EXPLAINED if v == EXPLAINED else "error" if v == UNEXPLAINED and abs(move) > err else "warn"


def _sentence(name: str, move: float, lvl: str, votes: Votes, limits: CheckLimits) -> str:
    """One line of the check's summary for a component that moved."""
    head = f"{name} {move:+.2f}"
    if name in _VOTES:
        return f"{head}: " + ("the users' own votes" if lvl == "votes" else
                              "the users' votes fell past the hard limit (a worse model, or a broken vote client?)")
    if name in _RATES:
        return f"{head}: a rate, judged alone"
    if votes.move is None or min(votes.rows_now, votes.rows_before) < limits.votes_min_rows:
        return (f"{head} with {votes.rows_now} votes now, {votes.rows_before} before (need "
                f"{limits.votes_min_rows} each): too few votes to tell")
    why = {EXPLAINED: "accepted change", UNKNOWN: "the votes are too noisy to tell",
           UNEXPLAINED: "the votes did not move with it (reward hacking or a broken client?)"}
    return (f"{head} with votes {votes.move:+.2f} ± {limits.votes_z * votes.se:.2f}: "
            f"{why[verdict(move, votes, limits)]}")


def _r(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 4)


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
    return judge(now, before, limits)


def judge(now: dict[str, Any], before: dict[str, Any], limits: CheckLimits) -> CheckOutcome:
    """The drift check from two `_run_stats` rows (this run's settled turns, the history's)."""
    votes = Votes.of(now, before)
    drift: dict[str, dict[str, Any]] = {}
    sentences = []
    for name in [*COMPONENTS, "total", *_RATES]:
        n_now, n_before = now.get(f"{name}_n") or 0, before.get(f"{name}_n") or 0
        if n_now < limits.drift_min_rows or n_before < limits.drift_min_rows:
            continue
        m_now, m_before = now[f"{name}_sum"] / n_now, before[f"{name}_sum"] / n_before
        lvl = level(name, m_now - m_before, votes, limits)
        drift[name] = {"now": _r(m_now), "before": _r(m_before), "drift": _r(m_now - m_before), "level": lvl}
        if lvl != "ok":
            sentences.append(_sentence(name, m_now - m_before, lvl, votes, limits))
    levels = {v["level"] for v in drift.values()}
    flagged = sorted(k for k, v in drift.items() if v["level"] in ("warn", "error"))
    return CheckOutcome(DRIFT, not flagged, "ERROR" if "error" in levels else "WARN", {
        "summary": "; ".join(sentences) or "no component moved",
        "flagged": flagged,
        "explained": sorted(k for k, v in drift.items() if v["level"] == EXPLAINED),
        "components": drift,
        "votes": {"now": _r(votes.now), "before": _r(votes.before), "move": _r(votes.move),
                  "se": _r(votes.se), "rows_now": votes.rows_now, "rows_before": votes.rows_before},
        "judged": len(drift),
        "history_runs": limits.drift_history_runs})


def evaluate(where: delta.Where, result: RewardRunResult, book: SpecBook,
             limits: CheckLimits | None = None) -> list[CheckOutcome]:
    limits = limits or CheckLimits()
    tables = [result.tables.settled, result.tables.provisional] if result.tables else []
    settled = result.tables.settled if result.tables else pa.table({"labelled": pa.array([], pa.bool_())})
    return [unlabelled_share(settled, limits), reward_bounds(tables, book),
            component_drift(where, result, limits)]
