"""Replay over the lake: settled turns of earlier iterations train again, rare outcomes first.

A liked reply at a 2% base rate, trained once, moves the adapter by one step's worth and is gone;
the next iteration's batch has maybe one other. Replay keeps such turns in play for a few more
iterations:

- the pool: turns of this tenant/task the ``trained_turns`` ledger credits to an adapter fewer than
  ``replay_max_uses`` times, whose age weight ``0.5 ** (age / replay_half_life)`` is still at least
  ``replay_min_weight``; never a turn the ledger marks as an eval prompt (adapter_version 0 row),
  nor one marked ``train = false`` (the pool re-checks the flag, whatever the ledger holds), nor one
  whose user had not consented at its time, or opted out since where the tenant's opt-outs are
  retroactive (``pipelines/lake/consent.py``, re-checked on every selection);
- ``age`` = learner iterations of this tenant/task (distinct adapter versions in the ledger) since
  the turn's first use, counting that one: 1 on the iteration right after its first use;
- priority: ``|reward - pool mean|`` descending (a rare positive in a mostly-disliked pool sits far
  from the mean), then newest first; the age weight goes into ``TrainTurn.weight``; the staleness of
  the behaviour policy is corrected in the loss (truncated IS over the logged logprobs).

The ledger holds one row per (turn, use), so a turn's use count is its number of rows.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from pipelines.train.batch import TrainTurn


@dataclass(frozen=True)
class ReplayTurn:
    """A turn of the pool: its record (``weight`` set to the age weight) and how it was used."""

    turn: TrainTurn
    uses: int          # times trained so far (this replay will be use uses + 1)
    age: int           # learner iterations since first use, counting that one
    event_time_ms: int


def replay_weight(age: int, half_life: float) -> float:
    """0.5 ** (age / half_life): 1 at first use, half after ``half_life`` iterations."""
    return 0.5 ** (age / half_life)


def max_replay_age(half_life: float, min_weight: float) -> int:
    """The largest age whose weight is still >= ``min_weight``."""
    return int(math.floor(half_life * math.log2(1.0 / min_weight) + 1e-9))


def prioritize(pool: Sequence[ReplayTurn], limit: int) -> list[ReplayTurn]:
    """The ``limit`` turns of ``pool`` farthest from its mean reward; ties: newest first, then id."""
    if not pool or limit <= 0:
        return []
    mean = sum(p.turn.reward for p in pool) / len(pool)
    return sorted(pool, key=lambda p: (-abs(p.turn.reward - mean), -p.event_time_ms, p.turn.turn_id))[:limit]


def use_stats(new: int, replayed: Sequence[ReplayTurn]) -> dict[str, Any]:
    """What the iteration logs: replay.* metrics and the {uses: count} histogram (uses after this
    iteration; a new turn is at 1)."""
    uses = [p.uses + 1 for p in replayed]
    hist = Counter(uses)
    if new:
        hist[1] += new
    return {"replay.turns": float(len(replayed)),
            "replay.uses_mean": float(sum(uses) / len(uses)) if uses else 0.0,
            "replay.uses_max": float(max(uses)) if uses else 0.0,
            "replay.weight_mean": float(sum(p.turn.weight for p in replayed) / len(replayed)) if replayed else 0.0,
            "uses_histogram": {str(k): hist[k] for k in sorted(hist)}}


def replay_pool(cfg: Any, tenant: str, task: str) -> list[ReplayTurn]:
    """Every turn eligible for replay (unordered); empty when replay is off or nothing was trained."""
    from pipelines.lake.consent import consented_sql
    from pipelines.lake.query import connect
    from pipelines.lake.ledger import has_ledger, ledger_source

    lc = cfg.learner
    if lc.replay_turns == 0 or lc.replay_max_uses <= 1 or not has_ledger(cfg.table_store):
        return []
    con = connect(cfg.lake, cfg.table_store)
    rows = con.execute(f"""
        WITH led AS (SELECT l.turn_id, l.adapter_version FROM {ledger_source(con, cfg.table_store)} l
                     WHERE l.tenant = ? AND l.task = ?),
             iterations AS (SELECT DISTINCT adapter_version AS v FROM led WHERE adapter_version > 0),
             used AS (SELECT turn_id, count(*) AS uses, min(adapter_version) AS first_v FROM led GROUP BY turn_id
                      HAVING min(adapter_version) > 0),  -- a version-0 row: an eval prompt, never again
             pool AS (SELECT u.turn_id, u.uses, (SELECT count(*) FROM iterations i WHERE i.v >= u.first_v) AS age
                      FROM used u WHERE u.uses < ?)
        SELECT t.turn_id, t.task, t.prompt_token_ids, t.input_messages::VARCHAR, t.output_token_ids,
               t.output_text, t.output_logprobs, r.total, md5(t.input_messages::VARCHAR), t.adapter_version,
               p.uses, p.age, epoch_ms(t.event_time)
        FROM turns t
        JOIN rewards r ON r.tenant = t.tenant AND r.trace_id = t.trace_id AND r.turn_id = t.turn_id
        JOIN pool p ON p.turn_id = t.turn_id
        WHERE r.settled AND r.labelled AND t.train AND t.tenant = ? AND t.task = ? AND p.age <= ?
          AND {consented_sql(con, cfg, tenant)}
        QUALIFY row_number() OVER (PARTITION BY t.turn_id ORDER BY r.reward_seq DESC) = 1""",
                       [tenant, task, lc.replay_max_uses, tenant, task,
                        max_replay_age(lc.replay_half_life, lc.replay_min_weight)]).fetchall()
    out = []
    for r in rows:
        w = replay_weight(int(r[11]), lc.replay_half_life)
        if w < lc.replay_min_weight:
            continue
        turn = TrainTurn(turn_id=r[0], task=r[1], prompt_token_ids=r[2], input_messages=json.loads(r[3]),
                         output_token_ids=r[4], output_text=r[5], behaviour_logprobs=r[6], reward=float(r[7]),
                         group_id=r[8], adapter_version=r[9])
        out.append(ReplayTurn(dataclasses.replace(turn, weight=w), int(r[10]), int(r[11]), int(r[12])))
    return out
