"""The simulator's labelled-share measure (pipelines/sim/coverage.py) is the reward engine's: the same
simulated sessions, sent as contract events through a real lake and reward run, label the same turns."""

from __future__ import annotations

import pytest

from reward_lake import at, land, now
from pipelines.contract.events import Feedback, Message, ModelTurn, SessionEnd
from pipelines.reward.engine import run_rewards
from pipelines.sim.coverage import play, turn_labels
from pipelines.sim.sessions import Session, UserModel


def session_events(s: Session, n: int, t0: float) -> list:
    """What an app sends for session `s` (trace `s<n>`): its turns, its feedback, its end."""
    env = dict(tenant="acme", app="sim", task="concise", trace_id=f"s{n}")
    out, t = [], t0
    for i, rec in enumerate(s.turns):
        turn_id = f"s{n}-t{i}"
        out.append(ModelTurn(**env, turn_id=turn_id, turn_index=i, model="m", event_time=at(t),
                             input_messages=[Message(role=m["role"], content=m["content"]) for m in rec.request],
                             output_text=rec.reply))
        for g in rec.signals:
            out.append(Feedback(**env, turn_id=turn_id, kind=g.kind, value=g.value, sentiment=g.sentiment,
                                text=g.text, event_time=at(t + 1)))
        t += 5
    out.append(SessionEnd(**env, outcome=s.outcome, task_success=s.task_success, turns=len(s.turns),
                          event_time=at(t)))
    return out


@pytest.mark.parametrize("um", [UserModel.realistic(), UserModel.realistic(0.2, send_sentiment=True,
                                                                           reports_task_success=True),
                                UserModel()], ids=["realistic", "realistic-app-knows", "sparse"])
def test_coverage_labels_what_the_reward_engine_labels(lake_root, um):
    sessions = play(um, 0.3, 150, seed=5)
    events = [e for n, s in enumerate(sessions) for e in session_events(s, n, 60.0 * n)]
    land(lake_root, events)
    result = run_rewards(lake_root, now=now(10 * 86400))   # every turn settled
    got = {r["turn_id"]: r["labelled"] for r in result.tables.settled.to_pylist()}
    want = {f"s{n}-t{i}": bool(x) for n, s in enumerate(sessions) for i, x in enumerate(turn_labels(s, hindsight=True))}
    assert got == want
    if um == UserModel.realistic():
        assert sum(want.values()) / len(want) <= 0.3
