"""A canary's settled sessions, per arm, from the lake: what ``decide`` judges.

A session is a trace (the gateway's sticky unit when the app sends no ``user``). It counts once
every turn of it the canary served has a settled reward, so a session is judged whole, never on
its early turns alone. Its numbers:

- ``reward``: the mean over its turns of the reward spec's ``total`` (0 for a settled turn with
  no signal: a turn nobody reacted to is neutral, and leaving it out would let an arm that
  draws fewer reactions look better or worse for that alone);
- guardrails, from the events themselves rather than the spec's weights (a spec that stops
  punishing tool errors must not hide them): ``tool_error_rate`` (calls whose outcome is not
  ok; absent without calls), ``dissatisfied_rate`` (turns with a dissatisfied follow-up),
  ``regenerate_rate`` (turns regenerated), ``abandoned`` (1 if the session ended abandoned,
  0 if completed; absent without a session end), ``latency_p95_s`` and ``output_tokens``
  (mean per turn).

Turns are the canary's when the gateway recorded an ``arm`` on them, they came after the canary
started, and one of its two versions served them.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pipelines.canary.decide import CHALLENGER_ARM, CHAMPION_ARM, Session
from pipelines.config.tables import TableStore
from pipelines.lake.query import connect

GUARDRAIL_COLUMNS = ("tool_error_rate", "dissatisfied_rate", "regenerate_rate", "abandoned", "latency_p95_s",
                     "output_tokens")

SESSIONS_SQL = """
WITH t AS (
    SELECT turn_id, trace_id, arm, event_time, latency_ms, len(output_token_ids) AS output_tokens
    FROM turns
    WHERE tenant = $tenant AND task = $task AND arm IS NOT NULL AND event_time >= $since
      AND ((arm = 'champion' AND adapter_version = $champion) OR (arm = 'challenger' AND adapter_version = $challenger))
),
r AS (SELECT turn_id, total FROM rewards WHERE settled AND tenant = $tenant AND task = $task),
fb AS (
    SELECT turn_id, bool_or(kind = 'follow_up' AND sentiment = 'dissatisfied') AS dissatisfied,
           bool_or(kind = 'regenerate') AS regenerated
    FROM feedback WHERE tenant = $tenant AND turn_id IN (SELECT turn_id FROM t) GROUP BY turn_id
),
calls AS (
    SELECT turn_id, count(*) AS n, count(*) FILTER (WHERE outcome <> 'ok') AS bad
    FROM tool_calls WHERE tenant = $tenant AND turn_id IN (SELECT turn_id FROM t) GROUP BY turn_id
),
ends AS (
    SELECT trace_id, arg_max(outcome, event_time) AS outcome
    FROM session_ends WHERE tenant = $tenant AND trace_id IN (SELECT trace_id FROM t) GROUP BY trace_id
)
SELECT t.trace_id, min(t.event_time) AS started, min(t.arm) AS arm, count(DISTINCT t.arm) AS arms,
       count(*) AS turns, count(r.turn_id) AS settled,
       avg(coalesce(r.total, 0.0)) AS reward,
       sum(calls.bad) / nullif(sum(calls.n), 0) AS tool_error_rate,
       avg(coalesce(fb.dissatisfied, false)::DOUBLE) AS dissatisfied_rate,
       avg(coalesce(fb.regenerated, false)::DOUBLE) AS regenerate_rate,
       CASE any_value(ends.outcome) WHEN 'abandoned' THEN 1.0 WHEN 'completed' THEN 0.0 END AS abandoned,
       quantile_cont(t.latency_ms, 0.95) / 1000.0 AS latency_p95_s,
       avg(t.output_tokens) AS output_tokens
FROM t
LEFT JOIN r USING (turn_id)
LEFT JOIN fb USING (turn_id)
LEFT JOIN calls USING (turn_id)
LEFT JOIN ends USING (trace_id)
GROUP BY t.trace_id
ORDER BY started, t.trace_id
"""


def canary_sessions(lake_root: str | Path, tables: TableStore | None, tenant: str, task: str, since: datetime, champion: int,
                    challenger: int) -> list[Session]:
    """The canary's settled sessions in the order they started (the sequential test's order).

    A session both arms served (possible only after a gateway restart during a share change) is
    left out: it is evidence for neither."""
    con = connect(lake_root, tables)
    try:
        rows = con.execute(SESSIONS_SQL, {"tenant": tenant, "task": task, "since": since, "champion": int(champion),
                                          "challenger": int(challenger)}).fetchall()
        names = [d[0] for d in con.description]
    finally:
        con.close()
    out = []
    for row in rows:
        r = dict(zip(names, row))
        if r["arms"] != 1 or r["settled"] < r["turns"]:
            continue
        metrics = {k: float(r[k]) for k in GUARDRAIL_COLUMNS if r[k] is not None}
        out.append(Session(CHALLENGER_ARM if r["arm"] == "challenger" else CHAMPION_ARM, float(r["reward"]), metrics))
    return out
