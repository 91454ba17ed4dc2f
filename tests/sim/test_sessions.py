"""The feedback-sparsity knob: how often users vote, and what the silent ones still tell."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.sim.sessions import Session, UserModel

POOL = [[{"role": "user", "content": f"question {i}"}] for i in range(20)]


def run(um: UserModel, n: int, p_liked: float, seed: int = 0) -> list[Session]:
    rng, out = random.Random(seed), []
    for i in range(n):
        s = Session.start(POOL, POOL[i % len(POOL)], um, random.Random(rng.getrandbits(64)))
        while not s.done:
            s.messages()
            s.observe(f"reply {len(s.turns)}", rng.random() < p_liked)
        out.append(s)
    return out


@pytest.mark.parametrize("rate", [0.05, 0.2, 0.5])
def test_share_of_voted_turns_is_explicit_rate(rate):
    sessions = run(UserModel(explicit_rate=rate), 3000, p_liked=0.1)
    turns = [t for s in sessions for t in s.turns]
    voted = sum(t.voted for t in turns) / len(turns)
    assert abs(voted - rate) < 4 * (rate * (1 - rate) / len(turns)) ** 0.5 + 0.005, voted
    assert all((t.voted) == any(g.kind == "thumbs" for g in t.signals) for t in turns)


def test_disliked_turns_without_a_vote_carry_an_implicit_negative():
    sessions = run(UserModel(), 2000, p_liked=0.1)
    seen = {"regenerate": 0, "dissatisfied": 0, "abandoned": 0}
    for s in sessions:
        for t in s.turns:
            if t.liked or t.voted:
                continue
            kinds = {(g.kind, g.sentiment) for g in t.signals}
            if ("regenerate", None) in kinds:
                seen["regenerate"] += 1
            elif ("follow_up", "dissatisfied") in kinds:
                seen["dissatisfied"] += 1
            else:  # the only other negative: the user left at this turn
                assert t is s.turns[-1] and s.outcome == "abandoned" and s.task_success is None
                seen["abandoned"] += 1
    n = sum(seen.values())
    assert n > 1000
    # the documented split 0.35 / 0.35 / 0.30
    assert abs(seen["regenerate"] / n - 0.35) < 0.05 and abs(seen["abandoned"] / n - 0.30) < 0.05, seen


def test_liked_turns_never_get_a_negative_and_sessions_end_by_the_last_reply():
    for s in run(UserModel(), 1000, p_liked=0.5):
        for t in s.turns:
            if t.liked:
                assert all(g.value in (None, 1.0) and g.sentiment in (None, "satisfied") for g in t.signals)
        lo, hi = s.um.turns_per_session
        assert 1 <= len(s.turns) <= hi
        if s.outcome == "completed":
            assert len(s.turns) == s.max_turns and s.task_success == s.turns[-1].liked


def test_noise_flips_that_share_of_votes():
    sessions = run(UserModel(explicit_rate=1.0, noise=0.2), 2000, p_liked=0.5)
    votes = [(t.liked, g.value) for s in sessions for t in s.turns for g in t.signals if g.kind == "thumbs"]
    flipped = sum((v > 0) != liked for liked, v in votes) / len(votes)
    assert abs(flipped - 0.2) < 0.03, flipped


def test_later_turns_continue_the_conversation():
    um = UserModel(turns_per_session=(3, 3), explicit_rate=0.0, p_regenerate=0.0, p_complain=1.0)
    s = Session.start(POOL, POOL[0], um, random.Random(1))
    first = s.messages()
    s.observe("bad reply", False)
    second = s.messages()
    assert second[: len(first)] == first and second[len(first)] == {"role": "assistant", "content": "bad reply"}
    assert second[-1]["role"] == "user" and POOL[0][0]["content"] in second[-1]["content"]
    s.observe("good reply", True)
    assert s.messages()[-2] == {"role": "assistant", "content": "good reply"}
    regen = Session.start(POOL, POOL[0], UserModel(turns_per_session=(2, 2), p_regenerate=1.0, p_complain=0.0), random.Random(0))
    before = regen.messages()
    regen.observe("bad", False)
    assert regen.messages() == before  # regenerate: the same request again


def test_dense_is_the_single_turn_episode():
    for s in run(UserModel.dense(), 300, p_liked=0.3):
        [t] = s.turns
        assert [g.kind for g in t.signals] == ["thumbs"] and (t.signals[0].value > 0) == t.liked
        assert s.outcome == "completed" and s.task_success == t.liked


@given(lo=st.integers(-2, 4), hi=st.integers(-2, 4), rate=st.floats(-1, 2), noise=st.floats(-1, 2))
@settings(max_examples=60, deadline=None)
def test_user_model_validates(lo, hi, rate, noise):
    valid = 1 <= lo <= hi and 0 <= rate <= 1 and 0 <= noise <= 0.5
    try:
        UserModel(turns_per_session=(lo, hi), explicit_rate=rate, noise=noise)
    except ValueError as e:
        assert not valid and ("turns_per_session" in str(e) or "explicit_rate" in str(e) or "noise" in str(e))
    else:
        assert valid
