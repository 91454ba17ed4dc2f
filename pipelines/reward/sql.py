"""The reward extraction in DuckDB SQL: events -> signals -> per-turn components.

Two steps, both vectorized:

1. `extract_sql`: new event files -> *signals*, one narrow row per event, read
   from the hot columns ingest stores beside the payload (`tables.HOT_COLUMNS`):
   no payload is read or parsed, so the big model-turn payloads (messages,
   token ids, logprobs) are never even decompressed.
2. `compute_sql` (statements over temp tables): pending signals + new signals
   + the settled-turn registry -> rewards, provisional rewards, corrections
   and the next pending set. Session outcomes join per trace, feedback and
   tool calls per turn; one hash aggregate per family, no per-row Python.

Every key carries the tenant: a turn is (tenant, trace_id, turn_id), a trace
(tenant, trace_id), an event (tenant, event_id). Ids are chosen by clients, so
a key without the tenant would let one tenant's events land on another's turns
(its thumbs on their rewards) or shadow their events as duplicates.

Inputs registered by the engine: `new_sig`, `pending` (SIGNAL_SCHEMA),
`reg` (settled turns of the traces at hand, from the rewards dataset) and
`params` (one row per tenant/task: `RewardSpec.params()`). The semantics are
defined by `rules.py`; `reference.py` implements them in plain Python and the
tests hold the two equal.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from pipelines.lake.tables import COMPONENTS
from pipelines.reward.spec import EXPLICIT_COMPONENTS

TS = pa.timestamp("us", tz="UTC")

SIGNAL_SCHEMA = pa.schema([
    ("event_id", pa.string()), ("type", pa.string()), ("tenant", pa.string()), ("app", pa.string()),
    ("task", pa.string()), ("trace_id", pa.string()), ("turn_id", pa.string()),
    ("event_time", TS), ("ingested_at", TS),
    ("kind", pa.string()),          # feedback kind, tool outcome or session outcome
    ("value", pa.float64()), ("scale_min", pa.float64()), ("scale_max", pa.float64()),
    ("sentiment", pa.string()), ("success", pa.bool_()), ("call_id", pa.string()), ("attempt", pa.int32()),
    ("turn_index", pa.int32()), ("latency_ms", pa.float64()), ("out_chars", pa.int32()),
    ("text_class", pa.string()),    # model turns: 'empty' | 'question' | NULL
    ("user_text", pa.string()),     # model turns: the last user message of the request (hindsight)
    ("out_text", pa.string()),      # model turns: the reply (hindsight; older pending snapshots: NULL)
])

# One row per turn that has a next turn (`hindsight.next_turn_hindsight`), registered by the engine.
HINDSIGHT_SCHEMA = pa.schema([("tenant", pa.string()), ("trace_id", pa.string()), ("turn_id", pa.string()),
                              ("hs_kind", pa.string()), ("hs_conf", pa.float64())])

_WS_CHARS = ["chr(32)", "chr(9)", "chr(13)", "chr(10)"]  # = rules.WHITESPACE
_WS = " || ".join(_WS_CHARS)
# rules.text_class; trimming only texts that end in whitespace (few) halves the cost of this column.
_ENDS_WS = " OR ".join(f"suffix(output_text, {c})" for c in _WS_CHARS)
_TEXT_CLASS = rf"""CASE WHEN output_text IS NULL OR output_text = '' THEN 'empty'
                 WHEN suffix(output_text, '?') THEN 'question'
                 WHEN {_ENDS_WS} THEN
                      CASE WHEN rtrim(output_text, {_WS}) = '' THEN 'empty'
                           WHEN suffix(rtrim(output_text, {_WS}), '?') THEN 'question' END END"""


def extract_sql(events: str, user_text: bool = True) -> str:
    """The signals of ``events``, a relation over event files (`lake.delta.scan`). ``user_text``:
    whether those files have that column (files of a release before it do not: NULL)."""
    return rf"""
SELECT event_id, type, tenant, app, task, trace_id, turn_id,
       event_time::TIMESTAMPTZ AS event_time, ingested_at::TIMESTAMPTZ AS ingested_at,
       kind, value, scale_min, scale_max, sentiment, task_success AS success, call_id,
       CASE WHEN type = 'tool_call' THEN coalesce(attempt, 1) END AS attempt,
       turn_index, latency_ms,
       CASE WHEN type = 'model_turn' THEN coalesce(length(output_text), 0)::INTEGER END AS out_chars,
       CASE WHEN type = 'model_turn' THEN {_TEXT_CLASS} END AS text_class,
       {"CASE WHEN type = 'model_turn' THEN user_text END" if user_text else "NULL::VARCHAR"} AS user_text,
       CASE WHEN type = 'model_turn' THEN output_text END AS out_text
FROM {events}
WHERE type IN ('model_turn', 'tool_call', 'feedback', 'session_end')
"""


# The component one signal contributes on its own (corrections and orphans), cf. rules.signal_component.
_SIGNAL_COMPONENT = """
CASE WHEN s.type = 'feedback' THEN CASE s.kind WHEN 'thumbs' THEN 'thumbs' WHEN 'rating' THEN 'rating'
       WHEN 'accept' THEN 'output' WHEN 'edit' THEN 'output' WHEN 'reject' THEN 'output'
       WHEN 'regenerate' THEN 'regenerate' WHEN 'follow_up' THEN 'follow_up' END
     WHEN s.type = 'tool_call' THEN 'tool' END"""
_SIGNAL_VALUE = """
CASE WHEN s.type = 'feedback' THEN CASE s.kind
       WHEN 'thumbs' THEN CASE WHEN s.value > 0 THEN 1.0::DOUBLE WHEN s.value < 0 THEN -1.0::DOUBLE END
       WHEN 'rating' THEN CASE WHEN coalesce(s.scale_max, p.rating_max) > coalesce(s.scale_min, p.rating_min)
            THEN 2.0 * (s.value - coalesce(s.scale_min, p.rating_min))
                 / (coalesce(s.scale_max, p.rating_max) - coalesce(s.scale_min, p.rating_min)) - 1.0 END
       WHEN 'accept' THEN p.v_accept WHEN 'edit' THEN p.v_edit WHEN 'reject' THEN p.v_reject
       WHEN 'regenerate' THEN p.v_regenerate
       WHEN 'follow_up' THEN CASE s.sentiment WHEN 'satisfied' THEN p.v_satisfied
                                              WHEN 'dissatisfied' THEN p.v_dissatisfied END END
     WHEN s.type = 'tool_call' THEN CASE s.kind WHEN 'ok' THEN p.t_ok WHEN 'timeout' THEN p.t_timeout
       WHEN 'error' THEN p.t_error WHEN 'invalid_arguments' THEN p.t_invalid END END"""

_COMPONENTS = COMPONENTS  # the total sums in this order, as rules.combine does (equal floats)
_TOTAL = " + ".join(["0.0::DOUBLE"] + [f"coalesce(p.w_{c} * {c}, 0.0)" for c in _COMPONENTS])
# rules.explicit_positive: the user liked the reply or acted on it (lifts the dodge cap when the spec says so)
_EXPLICIT_POSITIVE = " OR ".join(f"coalesce({c}, 0.0) > 0" for c in EXPLICIT_COMPONENTS)


# rules.hindsight: the kind's value x confidence; no signal below the spec's min confidence, for a kind
# valued 0, or beside the same evidence given explicitly (regenerate; follow-up sentiment).
_HS_VALUE = ("CASE t.hs_kind WHEN 'complaint' THEN p.h_complaint WHEN 'reask' THEN p.h_reask "
             "WHEN 'thanks' THEN p.h_thanks WHEN 'new_topic' THEN p.h_new_topic END")
_HINDSIGHT = f"""CASE WHEN t.hs_conf >= p.h_min_confidence AND {_HS_VALUE} <> 0
                  AND NOT (t.hs_kind = 'reask' AND coalesce(t.regen, false))
                  AND NOT (t.hs_kind IN ('complaint', 'thanks') AND t.follow_s IS NOT NULL)
             THEN {_HS_VALUE} * t.hs_conf END"""

TURN = "tenant, trace_id, turn_id"     # the key of a turn
TRACE = "tenant, trace_id"              # the key of a trace (session ends)
EVENT = "tenant, event_id"              # the key of an event (re-deliveries)

DUPLICATE_IDS = f"""SELECT
  (SELECT count(*) FROM (SELECT {EVENT} FROM (SELECT {EVENT} FROM pending UNION ALL SELECT {EVENT} FROM new_sig)
                         GROUP BY ALL HAVING count(*) > 1)),
  (SELECT count(*) FROM (SELECT {TURN} FROM (SELECT {TURN} FROM pending WHERE type = 'model_turn' UNION ALL
                         SELECT {TURN} FROM new_sig WHERE type = 'model_turn') GROUP BY ALL HAVING count(*) > 1))"""


def _on(a: str, b: str, key: str) -> str:
    """`a.k = b.k AND ...` over the columns of `key` (a join condition on a composite key)."""
    return " AND ".join(f"{a}.{k} = {b}.{k}" for k in key.split(", "))


def compute_sql(now: datetime, dedupe: bool = True, dedupe_turns: bool = True) -> list[str]:
    """The statements of one run; `now` decides what has settled (event time).

    `dedupe=False` / `dedupe_turns=False` are the fast paths when DUPLICATE_IDS
    found no repeated event id / turn id: a window over 1M rows costs more than
    the rest of a step, and repeats are rare.
    """
    now_lit = f"TIMESTAMPTZ '{now.isoformat()}'"
    union = "SELECT *, false AS is_new FROM pending UNION ALL BY NAME SELECT *, true AS is_new FROM new_sig"
    spec_join = "JOIN params p ON p.tenant = {0}.tenant AND p.task_key = coalesce({0}.task, '')"
    return [
        # All signals in play: pending first, so a re-delivered event keeps its first copy.
        f"""CREATE OR REPLACE TEMP TABLE sig AS SELECT * FROM ({union})
            QUALIFY row_number() OVER (PARTITION BY {EVENT} ORDER BY is_new, ingested_at, event_time) = 1"""
        if dedupe else f"CREATE OR REPLACE TEMP VIEW sig AS {union}",
        # Known turns: the first arrival of each turn (a window only when some key repeats).
        f"""CREATE OR REPLACE TEMP TABLE turns0 AS
           SELECT turn_id, trace_id, tenant, app, task, turn_index, event_time AS turn_time,
                  latency_ms, out_chars, text_class
           FROM sig ANTI JOIN (SELECT {TURN} FROM reg) r USING ({TURN})
           WHERE type = 'model_turn' AND turn_id IS NOT NULL
           {f"QUALIFY row_number() OVER (PARTITION BY {TURN} ORDER BY ingested_at, event_id) = 1"
            if dedupe_turns else ""}""",
        # Feedback: last wins within each family, by (event_time, ingested_at, event_id).
        f"""CREATE OR REPLACE TEMP TABLE fb AS
           SELECT {TURN}, thumbs_v, rating_v.v AS rating_value, rating_v.lo AS rating_lo, rating_v.hi AS rating_hi,
                  output_k, regen, follow_s FROM (
           SELECT {TURN},
             arg_max(value, ord) FILTER (WHERE kind = 'thumbs' AND value <> 0) AS thumbs_v,
             arg_max({{'v': value, 'lo': scale_min, 'hi': scale_max}}, ord)
                 FILTER (WHERE kind = 'rating' AND value IS NOT NULL) AS rating_v,
             arg_max(kind, ord) FILTER (WHERE kind IN ('accept', 'edit', 'reject')) AS output_k,
             bool_or(kind = 'regenerate') AS regen,
             arg_max(sentiment, ord) FILTER (WHERE kind = 'follow_up'
                                             AND sentiment IN ('satisfied', 'dissatisfied')) AS follow_s
           FROM (SELECT {TURN}, kind, value, scale_min, scale_max, sentiment,
                        {{'t': event_time, 'i': ingested_at, 'e': event_id}} AS ord
                 FROM sig WHERE type = 'feedback')
           GROUP BY {TURN})""",
        # Tool calls: the worst outcome wins (so duplicates cannot matter); a retry is counted
        # once per call_id, so a re-sent retry is one retry.
        f"""CREATE OR REPLACE TEMP TABLE tl AS
           SELECT {TURN}, count(*) AS n_calls,
             coalesce(len(list_distinct(list(coalesce(call_id, event_id)) FILTER (WHERE attempt > 1))), 0)
                 AS n_retries,
             bool_or(kind = 'ok') AS has_ok, bool_or(kind = 'timeout') AS has_timeout,
             bool_or(kind = 'error') AS has_error, bool_or(kind = 'invalid_arguments') AS has_invalid
           FROM sig WHERE type = 'tool_call' GROUP BY {TURN}""",
        # Session end: the last session_end event of the trace wins as a whole.
        f"""CREATE OR REPLACE TEMP TABLE se AS
           SELECT {TRACE}, true AS has_se, s.outcome AS se_outcome, s.success AS se_success,
                  s.at AS session_end_at FROM (
             SELECT {TRACE}, arg_max({{'outcome': kind, 'success': success, 'at': event_time}},
                                      {{'t': event_time, 'i': ingested_at, 'e': event_id}}) AS s
             FROM sig WHERE type = 'session_end' GROUP BY {TRACE})""",
        # Known turns (new or open, plus already-settled turns of these traces) -> components.
        f"""CREATE OR REPLACE TEMP TABLE rw AS
           WITH turns AS (
             SELECT *, false AS settled_before FROM turns0 LEFT JOIN fb USING ({TURN}) LEFT JOIN tl USING ({TURN})
                  LEFT JOIN hs USING ({TURN})
             UNION ALL BY NAME
             SELECT *, true AS settled_before FROM reg),
           rw0 AS (
           SELECT t.*, p.spec_version, se.session_end_at,
             CASE WHEN t.thumbs_v > 0 THEN 1.0::DOUBLE WHEN t.thumbs_v < 0 THEN -1.0::DOUBLE END AS thumbs,
             CASE WHEN coalesce(t.rating_hi, p.rating_max) > coalesce(t.rating_lo, p.rating_min)
                  THEN 2.0 * (t.rating_value - coalesce(t.rating_lo, p.rating_min))
                       / (coalesce(t.rating_hi, p.rating_max) - coalesce(t.rating_lo, p.rating_min)) - 1.0
                  END AS rating,
             CASE t.output_k WHEN 'accept' THEN p.v_accept WHEN 'edit' THEN p.v_edit
                             WHEN 'reject' THEN p.v_reject END AS output,
             CASE WHEN t.regen THEN p.v_regenerate END AS regenerate,
             CASE t.follow_s WHEN 'satisfied' THEN p.v_satisfied WHEN 'dissatisfied' THEN p.v_dissatisfied
                  END AS follow_up,
             CASE WHEN se.has_se IS NULL THEN NULL
                  WHEN p.credit_rule = 'last_turn' THEN CASE WHEN t.turn_index = tr.last_index THEN 1.0::DOUBLE END
                  WHEN p.credit_rule = 'uniform' THEN 1.0::DOUBLE
                  WHEN pow(p.gamma, tr.last_index - t.turn_index) >= p.min_share
                       THEN pow(p.gamma, tr.last_index - t.turn_index) END AS share,
             CASE WHEN se.se_outcome = 'abandoned' THEN p.v_abandoned * share END AS abandon,
             CASE se.se_success WHEN true THEN p.v_success * share WHEN false THEN p.v_failure * share END AS session,
             CASE WHEN t.n_calls > 0 THEN least(CASE WHEN t.has_ok THEN p.t_ok END,
                  CASE WHEN t.has_timeout THEN p.t_timeout END, CASE WHEN t.has_error THEN p.t_error END,
                  CASE WHEN t.has_invalid THEN p.t_invalid END) END AS tool,
             CASE WHEN t.n_calls > 0 THEN -least(t.n_retries, p.retry_cap) / p.retry_cap END AS retries,
             CASE WHEN p.w_latency <> 0 AND t.latency_ms IS NOT NULL
                  THEN -least(greatest(t.latency_ms, 0.0) / p.latency_budget_ms, 1.0) END AS latency,
             CASE WHEN p.w_length <> 0 AND t.out_chars IS NOT NULL
                  THEN -least(t.out_chars / p.length_budget_chars, 1.0) END AS length,
             {_HINDSIGHT} AS hindsight,
             CASE WHEN p.dodge_cap IS NOT NULL AND coalesce(t.n_calls, 0) = 0 THEN
                  CASE WHEN t.text_class = 'empty' THEN 'silent'
                       WHEN t.text_class = 'question' AND t.out_chars <= p.clarify_max_chars THEN 'clarify' END
                  END AS dodge,
             p.dodge_cap, p.dodge_explicit_overrides, p.window_s, p.grace_s,
             {", ".join(f"p.w_{c}" for c in _COMPONENTS)}
           FROM turns t {spec_join.format('t')}
           LEFT JOIN se ON {_on('se', 't', TRACE)}
           LEFT JOIN (SELECT {TRACE}, max(turn_index) AS last_index FROM (
                        SELECT {TRACE}, turn_index FROM turns0 UNION ALL SELECT {TRACE}, turn_index FROM reg)
                      GROUP BY {TRACE}) tr ON {_on('tr', 't', TRACE)}),
           rw1 AS (
             SELECT *, (thumbs IS NOT NULL OR rating IS NOT NULL OR output IS NOT NULL
                        OR regenerate IS NOT NULL OR follow_up IS NOT NULL OR abandon IS NOT NULL
                        OR session IS NOT NULL OR hindsight IS NOT NULL OR coalesce(tool, 0) < 0 OR coalesce(retries, 0) < 0) AS labelled0,
                    least(turn_time + to_seconds(window_s), session_end_at + to_seconds(grace_s)) AS settle_at
             FROM rw0)
           SELECT turn_id, trace_id, tenant, app, task, turn_index, turn_time, {", ".join(_COMPONENTS)},
             dodge, spec_version, share, settle_at, settled_before,
             CASE WHEN dodge IS NOT NULL AND NOT (dodge_explicit_overrides <> 0 AND ({_EXPLICIT_POSITIVE}))
                  THEN least(coalesce(total0, dodge_cap), dodge_cap) ELSE total0 END AS total,
             labelled0 OR dodge IS NOT NULL AS labelled,
             CASE WHEN session_end_at + to_seconds(grace_s) < turn_time + to_seconds(window_s)
                  THEN 'session_end' ELSE 'window' END AS settle_reason,
             NOT settled_before AND settle_at <= {now_lit} AS settled_now,
             NOT settled_before AND NOT settle_at <= {now_lit} AS open
           FROM (SELECT *, CASE WHEN labelled0 THEN {_TOTAL.replace('p.', '')} END AS total0 FROM rw1)""",
        # Signals whose turn (or, for a session end, trace) is unknown: held for one window, then recorded.
        f"""CREATE OR REPLACE TEMP TABLE orphan AS
           WITH o AS (
             SELECT * FROM sig ANTI JOIN (SELECT {TURN} FROM rw) r USING ({TURN})   -- a NULL turn_id is kept
             WHERE type IN ('feedback', 'tool_call')
             UNION ALL
             SELECT * FROM sig ANTI JOIN (SELECT DISTINCT {TRACE} FROM rw) r USING ({TRACE})
             WHERE type = 'session_end')
           SELECT o.*, o.event_time + to_seconds(p.window_s) <= {now_lit} AS expired
           FROM o {spec_join.format('o')}""",
        f"""CREATE OR REPLACE TEMP TABLE corrections AS
           SELECT s.event_id, s.type AS event_type, s.kind, s.tenant, s.app, s.task, s.trace_id, s.turn_id,
                  s.event_time, 'after_settle' AS reason, {_SIGNAL_COMPONENT} AS component,
                  {_SIGNAL_VALUE} AS value, p.spec_version
           FROM sig s JOIN rw ON {_on('rw', 's', TURN)} AND rw.settled_before {spec_join.format('rw')}
           WHERE s.is_new AND s.type IN ('feedback', 'tool_call', 'model_turn')
           UNION ALL
           SELECT s.event_id, s.type, s.kind, s.tenant, s.app, s.task, s.trace_id, rw.turn_id, s.event_time,
                  'after_settle', c.component, c.value, rw.spec_version
           FROM sig s JOIN rw ON {_on('rw', 's', TRACE)} AND rw.settled_before AND rw.share IS NOT NULL
           {spec_join.format('rw')}
           CROSS JOIN LATERAL (SELECT * FROM (VALUES
                ('abandon', CASE WHEN s.kind = 'abandoned' THEN p.v_abandoned * rw.share END),
                ('session', CASE s.success WHEN true THEN p.v_success * rw.share
                                           WHEN false THEN p.v_failure * rw.share END)) v(component, value)
                WHERE v.value IS NOT NULL) c
           WHERE s.is_new AND s.type = 'session_end'
           UNION ALL
           -- a late session end with nothing to credit: still recorded, once, against the trace
           SELECT s.event_id, s.type, s.kind, s.tenant, s.app, s.task, s.trace_id, NULL, s.event_time,
                  'after_settle', NULL, NULL, p.spec_version
           FROM sig s {spec_join.format('s')}
           WHERE s.is_new AND s.type = 'session_end' AND EXISTS (SELECT 1 FROM reg WHERE {_on('reg', 's', TRACE)})
             AND NOT EXISTS (SELECT 1 FROM rw WHERE {_on('rw', 's', TRACE)} AND NOT rw.settled_before)
             AND NOT EXISTS (SELECT 1 FROM rw WHERE {_on('rw', 's', TRACE)} AND rw.settled_before
                             AND rw.share IS NOT NULL AND (s.kind = 'abandoned' OR s.success IS NOT NULL))
           UNION ALL
           SELECT s.event_id, s.type, s.kind, s.tenant, s.app, s.task, s.trace_id, s.turn_id, s.event_time,
                  'unknown_turn', {_SIGNAL_COMPONENT}, {_SIGNAL_VALUE}, p.spec_version
           FROM orphan s {spec_join.format('s')} WHERE s.expired""",
        # What the next run must see again: everything of turns still open, and young orphans.
        f"""CREATE OR REPLACE TEMP TABLE next_pending AS
           SELECT * EXCLUDE (is_new) FROM sig s SEMI JOIN (SELECT {TURN} FROM rw WHERE open) o USING ({TURN})
           WHERE s.type <> 'session_end'
           UNION ALL
           SELECT * EXCLUDE (is_new) FROM sig s SEMI JOIN (SELECT DISTINCT {TRACE} FROM rw WHERE open) o
                USING ({TRACE})
           WHERE s.type = 'session_end'
           UNION ALL
           SELECT * EXCLUDE (is_new, expired) FROM orphan WHERE NOT expired""",
    ]


REWARD_COLUMNS = ("tenant, (turn_time AT TIME ZONE 'UTC')::DATE AS date, app, task, trace_id, turn_id, "
                  "turn_index, turn_time, " + ", ".join(f"{c}::DOUBLE AS {c}" for c in COMPONENTS)
                  + ", dodge, labelled, total::DOUBLE AS total, settled_now AS settled, settle_at, settle_reason, "
                  "spec_version")


def rewards_sql(which: str) -> str:
    """`settled`: turns that settle in this run; `provisional`: turns still open."""
    cond = "settled_now" if which == "settled" else "open"
    return f"SELECT {REWARD_COLUMNS} FROM rw WHERE {cond}"
