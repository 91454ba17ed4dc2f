"""Offline sessions (pipelines/sim/offline.py): the events an app would emit for simulated users
served by a local policy, valid by the contract, with the behaviour the learner needs (token ids,
logprobs), what the users did (votes, regenerates, abandonment, next messages), and settled once
landed and rewarded. Real tiny Llama, real lake, real reward engine."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pipelines.contract.events import Feedback, ModelTurn, SessionEnd
from pipelines.contract.validate import validate_event
from pipelines.lake.query import connect
from pipelines.reward.engine import run_rewards
from pipelines.sim.families import family
from pipelines.sim.offline import OfflineTraffic, play_sessions
from pipelines.sim.sessions import UserModel
from tests.reward.reward_lake import land

START = datetime(2026, 11, 1, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from pipelines.models.tiny import make_tiny_llama
    from pipelines.sim.policy import HFPolicy

    return HFPolicy(make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny", seed=0, warmup_steps=0))


def test_sessions_become_valid_events_that_settle_with_what_users_did(policy, tmp_path):
    fam, um = family("style"), UserModel.realistic(0.3)
    traffic = OfflineTraffic(sessions=60, batch=16, seed=3)
    events, liked = play_sessions(policy, fam, um, traffic, START)
    turns = [e for e in events if isinstance(e, ModelTurn)]
    ends = [e for e in events if isinstance(e, SessionEnd)]
    assert len(turns) == len(liked) >= 60 and len(ends) == 60
    for e in events:
        validate_event(e.to_dict())  # what the gateway would have accepted
    for t in turns:
        assert len(t.output_token_ids) == len(t.output_logprobs) > 0 and t.prompt_token_ids
        assert all(lp <= 0 for lp in t.output_logprobs)
    kinds = {e.kind for e in events if isinstance(e, Feedback)}
    assert "thumbs" in kinds and kinds <= {"thumbs", "regenerate"}  # realistic apps send no follow_up sentiment
    assert any(t.turn_index > 0 for t in turns)  # sessions go on: next messages hindsight can read
    assert {e.outcome for e in ends} <= {"completed", "abandoned"} and all(e.task_success is None for e in ends)

    again, liked_again = play_sessions(policy, fam, um, traffic, START)  # a seed reproduces the same users
    assert [t.output_text for t in turns] == [e.output_text for e in again if isinstance(e, ModelTurn)]
    assert liked == liked_again

    lake = tmp_path / "lake"
    land(lake, events)
    run_rewards(lake, now=START + timedelta(days=2))
    settled, n = connect(lake).execute("""SELECT count(*) FILTER (WHERE settled), count(*) FROM
        (SELECT * FROM rewards QUALIFY row_number() OVER (PARTITION BY turn_id ORDER BY reward_seq DESC) = 1)""").fetchone()
    assert settled == n == len(turns)
