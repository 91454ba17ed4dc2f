"""The drift check tells a better (or worse) model the users noticed from reward hacking or a broken
client: a component that moves with the explicit votes passes as information; one that moves while
the votes stay put fails, ERROR when the votes are measured, WARN when too few to tell."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.reward.checks import (
    DRIFT, EXPLAINED, UNEXPLAINED, UNKNOWN, CheckLimits, Votes, evaluate, level, verdict,
)
from pipelines.reward.engine import run_rewards
from pipelines.reward.spec import SpecBook
from reward_lake import fb, land, now, turn

LIMITS = CheckLimits()


def traffic(prefix: str, n: int, voters_like: float, others_like: float, t0: float,
            vote_every: int = 2, seed: int = 0) -> list:
    """`n` one-turn traces; every `vote_every`-th turn gets a thumbs vote (liked with probability
    `voters_like`), the others only what users do (`others_like`): liked, a satisfied follow-up;
    disliked, a regenerate or a dissatisfied follow-up."""
    rng = random.Random(seed)
    events = []
    for i in range(n):
        tid, trace, t = f"{prefix}{i}", f"{prefix}-t{i}", t0 + i
        events.append(turn(tid, 0, t, trace_id=trace))
        if i % vote_every == 0:
            events.append(fb(tid, "thumbs", t=t + 5, value=1 if rng.random() < voters_like else -1, trace_id=trace))
        elif rng.random() < others_like:
            events.append(fb(tid, "follow_up", t=t + 5, text="thanks!", sentiment="satisfied", trace_id=trace))
        elif rng.random() < 0.5:
            events.append(fb(tid, "regenerate", t=t + 5, trace_id=trace))
        else:
            events.append(fb(tid, "follow_up", t=t + 5, text="that's wrong", sentiment="dissatisfied",
                             trace_id=trace))
    return events


def drift_after(root: Path, before: dict, after: dict):
    """Two reward runs over one lake: 400 turns of `before` traffic, then 400 of `after`; the drift
    check of the second."""
    book = SpecBook()
    land(root, traffic("a", 400, t0=-20000, seed=1, **before))
    run_rewards(root, book, now=now(-20000 + 400 + 3700))
    land(root, traffic("b", 400, t0=-10000, seed=2, **after))
    result = run_rewards(root, book, now=now(-10000 + 400 + 3700))
    assert result.settled == 400
    return next(o for o in evaluate(root, result, book) if o.name == DRIFT)


def test_a_better_model_the_users_vote_for_passes_as_explained(lake_root):
    """More thumbs up and more thanks, fewer regenerations: the change the gate accepted."""
    d = drift_after(lake_root, dict(voters_like=0.3, others_like=0.3), dict(voters_like=0.8, others_like=0.8))
    assert d.passed, d.metadata
    c = d.metadata["components"]
    assert c["follow_up"]["level"] == c["total"]["level"] == "explained" and c["follow_up"]["drift"] > 0.25
    assert c["thumbs"]["level"] == "votes" and d.metadata["votes"]["move"] > 0.5
    assert {"follow_up", "total"} <= set(d.metadata["explained"]) and d.metadata["flagged"] == []
    assert "follow_up +" in d.metadata["summary"] and ": accepted change" in d.metadata["summary"]
    assert all(round(v, 4) == v for v in d.metadata["votes"].values() if isinstance(v, float))


def test_follow_ups_that_jump_while_the_votes_stay_flat_fail_as_error(lake_root):
    """The policy learned to make users type "thanks" (or a client started sending satisfied on
    every turn) while the voters like it no better: reward hacking's signature."""
    d = drift_after(lake_root, dict(voters_like=0.5, others_like=0.2), dict(voters_like=0.5, others_like=1.0))
    assert not d.passed and d.severity == "ERROR", d.metadata
    assert d.metadata["components"]["follow_up"]["level"] == "error" and "follow_up" in d.metadata["flagged"]
    assert "the votes did not move with it" in d.metadata["summary"]


def test_too_few_votes_to_tell_warns_and_says_so(lake_root):
    """The same jump with a vote on 1 turn in 40 (10 per run): the check cannot tell, so WARN."""
    d = drift_after(lake_root, dict(voters_like=0.5, others_like=0.2, vote_every=40),
                    dict(voters_like=0.5, others_like=1.0, vote_every=40))
    assert not d.passed and d.severity == "WARN", d.metadata
    assert d.metadata["components"]["follow_up"]["level"] == "warn"
    assert d.metadata["votes"]["rows_now"] == 10
    assert "follow_up" in d.metadata["summary"] and "too few votes to tell" in d.metadata["summary"]


def test_no_movement_passes(lake_root):
    d = drift_after(lake_root, dict(voters_like=0.5, others_like=0.5), dict(voters_like=0.5, others_like=0.5))
    assert d.passed and d.metadata["summary"] == "no component moved", d.metadata
    assert {v["level"] for v in d.metadata["components"].values()} == {"ok"}
    assert d.metadata["judged"] >= 4


def test_votes_that_collapse_warn_even_when_they_explain_the_rest(lake_root):
    """A worse model the users say is worse (or a vote client that sends thumbs-down on everything):
    the components are explained, the votes' own fall past the hard limit warns."""
    d = drift_after(lake_root, dict(voters_like=0.8, others_like=0.8), dict(voters_like=0.05, others_like=0.1))
    assert not d.passed and d.severity == "WARN", d.metadata
    assert d.metadata["flagged"] == ["thumbs"] and "follow_up" in d.metadata["explained"]
    assert "the users' votes fell" in d.metadata["summary"]


# --- the decision rule alone ---

def votes(move: float, se: float = 0.05, rows: int = 200) -> Votes:
    return Votes(now=move / 2, before=-move / 2, se=se, rows_now=rows, rows_before=rows)


def test_the_rule_on_its_cases():
    assert verdict(0.6, votes(0.5), LIMITS) == EXPLAINED                  # same way, most of it
    assert verdict(-0.6, votes(-0.3), LIMITS) == EXPLAINED                # a share is enough, either sign
    assert verdict(0.6, votes(0.0), LIMITS) == UNEXPLAINED                # flat
    assert verdict(0.6, votes(-0.3), LIMITS) == UNEXPLAINED               # opposite
    assert verdict(0.6, votes(0.5, rows=LIMITS.votes_min_rows - 1), LIMITS) == UNKNOWN  # too few
    assert verdict(0.6, votes(0.1, se=0.1), LIMITS) == UNKNOWN            # too noisy either way
    assert level("tool", 0.6, votes(0.0), LIMITS) == "error"              # measured, flat, past the hard limit
    assert level("tool", 0.4, votes(0.0), LIMITS) == "warn"               # ... under it
    assert level("tool", 0.6, votes(0.0, rows=5), LIMITS) == "warn"       # cannot tell: never ERROR
    assert level("tool", 0.2, votes(-1.0), LIMITS) == "ok"                # did not move
    assert level("thumbs", 0.9, votes(0.9), LIMITS) == "votes"            # the reference itself
    assert level("thumbs", -0.6, votes(-0.6), LIMITS) == "warn"           # ... falling past the limit
    assert level("dodge_rate", 0.2, votes(0.9), LIMITS) == "warn"         # rates are judged alone


moves = st.floats(-2, 2).filter(lambda x: abs(x) > 1e-3)


@settings(max_examples=300, deadline=None)
@given(move=moves, vote_move=moves, se=st.floats(0, 0.3), k=st.floats(0.05, 20))
def test_scaling_an_explained_move_never_turns_red(move, vote_move, se, k):
    """A component and the votes moving together by any factor stay explained (a bigger or smaller
    version of an accepted change is still one), and never fail as ERROR."""
    if verdict(move, votes(vote_move, se), LIMITS) == EXPLAINED and abs(k * vote_move) <= 2:
        assert verdict(k * move, votes(k * vote_move, se), LIMITS) != UNEXPLAINED
        assert level("follow_up", k * move, votes(k * vote_move, se), LIMITS) != "error"
        if k >= 1:
            assert verdict(k * move, votes(k * vote_move, se), LIMITS) == EXPLAINED


@settings(max_examples=300, deadline=None)
@given(move=moves, vote_move=moves, more=st.floats(0, 2), se=st.floats(0, 0.3))
def test_votes_moving_further_the_same_way_never_hurt(move, vote_move, more, se):
    rank = {UNEXPLAINED: 0, UNKNOWN: 1, EXPLAINED: 2}
    further = vote_move + (more if move > 0 else -more)
    assert rank[verdict(move, votes(further, se), LIMITS)] >= rank[verdict(move, votes(vote_move, se), LIMITS)]
