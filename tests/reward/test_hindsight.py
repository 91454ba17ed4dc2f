"""Hindsight signals from the next user message (pipelines/reward/hindsight.py): total and bounded on
any text, right on the simulator's phrases and re-asked questions, and calibrated against votes."""

from __future__ import annotations

import logging
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.reward.hindsight import (KINDS, NONE, VALUES, Hindsight, calibrate, classify, format_calibration,
                                        log_calibration, similarity, trace_hindsight)
from pipelines.sim.env import TEMPLATES
from pipelines.sim.families import families
from pipelines.sim.sessions import COMPLAINTS, THANKS, Session, UserModel

QUESTION = "How do I reset my password?"
CUE_CHARS = list("thanks not wrong?! I asked ありがとう👍👎'’")
texts = st.one_of(st.none(), st.text(max_size=300), st.text(alphabet=st.sampled_from(CUE_CHARS), max_size=60))


@given(nxt=texts, prev=texts, reply=texts)
@settings(max_examples=400, deadline=None)
def test_classify_is_total_bounded_and_deterministic(nxt, prev, reply):
    h = classify(nxt, prev, reply)
    assert h.kind in KINDS
    assert 0.0 <= h.confidence <= 1.0 and 0.0 <= h.similarity <= 1.0
    assert -1.0 <= h.value <= 1.0 and math.copysign(1, VALUES[h.kind]) * h.value >= 0
    assert classify(nxt, prev, reply) == h
    assert (h.kind == "none") == (h.confidence == 0.0 and h.kind == "none")


@given(a=st.text(max_size=200), b=st.text(max_size=200))
@settings(max_examples=200, deadline=None)
def test_similarity_is_bounded_and_a_question_repeats_itself(a, b):
    assert 0.0 <= similarity(a, b) <= 1.0
    assert similarity(a, b) == similarity(a, b)
    assert similarity(a, a) in (0.0, 1.0)   # 0 only for text without words


messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                                           "content": st.one_of(st.text(max_size=40), st.none())}), max_size=4)


@given(turns=st.lists(st.tuples(messages, st.text(max_size=40)), max_size=5))
@settings(max_examples=200, deadline=None)
def test_trace_hindsight_is_total(turns):
    out = trace_hindsight(turns)
    assert len(out) == len(turns) and (not out or out[-1] is None)
    assert all(isinstance(h, Hindsight) for h in out[:-1])


@pytest.mark.parametrize("complaint", COMPLAINTS)
def test_the_simulator_s_complaints_are_complaints(complaint):
    for text in (complaint, f"{complaint} {QUESTION}"):
        h = classify(text, QUESTION, "Some answer.")
        assert h.kind == "complaint" and h.confidence >= 0.85 and h.value <= -0.85, (text, h)


@pytest.mark.parametrize("thanks", THANKS)
def test_the_simulator_s_thanks_are_thanks(thanks):
    for text in (thanks, f"{thanks} What is the status of an order?"):
        h = classify(text, QUESTION, "Some answer.")
        assert h.kind == "thanks" and h.confidence >= 0.85 and h.value >= 0.85, (text, h)


@pytest.mark.parametrize("text,kind", [
    ("Thanks, but that's not what I asked.", "complaint"),   # a correction outweighs politeness
    ("No, I meant the admin password.", "complaint"),
    ("That’s wrong.", "complaint"),                          # typographic apostrophe
    ("What's wrong with my order?", "new_topic"),            # "wrong" in a new question is no complaint
    ("Great, now how do I cancel an order?", "thanks"),
    ("ありがとうございます！", "thanks"),
    ("👍", "thanks"),
    ("👎", "complaint"),
    ("", "none"),
    ("  ?! ", "none"),
])
def test_cues(text, kind):
    assert classify(text, QUESTION).kind == kind


@pytest.mark.parametrize("again", [QUESTION, "how do i reset my password", "How can I reset my password??",
                                   "Password reset: how?", "I need to reset my password. How?",
                                   "Reset my password please"])
def test_re_asked_and_rephrased_questions_are_reasks(again):
    h = classify(again, QUESTION, "Try turning it off and on.")
    assert h.kind == "reask" and h.confidence >= 0.5 and h.value <= -0.5, (again, h)


def test_a_different_question_is_a_new_topic_for_every_family():
    for name, fam in families().items():
        prompts = [p[-1]["content"] for p in fam.prompts("train")]
        per_topic = len(getattr(fam, "templates", TEMPLATES))   # concise: pipelines/sim/env.py
        for i in range(0, len(prompts) - per_topic, per_topic):   # same template, next topic
            h = classify(prompts[i + per_topic], prompts[i])
            assert h.kind == "new_topic" and h.value > 0, (name, prompts[i], prompts[i + per_topic], h)


def test_trace_hindsight_reads_the_next_message_and_sees_regenerates():
    q1 = [{"role": "user", "content": QUESTION}]
    a1 = "Open settings."
    thanks = q1 + [{"role": "assistant", "content": "again"}, {"role": "user", "content": "Thanks! And my email?"}]
    a2 = "Open profile."
    other = [{"role": "user", "content": "Something else entirely"}]
    out = trace_hindsight([(q1, a1), (q1, "again"), (thanks, a2), (other, "x")])
    assert out[0] == Hindsight("reask", 1.0, 1.0, "<same request>")   # the same request again: a regenerate
    assert out[1].kind == "thanks"
    assert out[2] is NONE            # the next turn does not continue after this reply
    assert out[3] is None            # the last turn: no next message yet


def test_calibrate_counts_agreement_and_suggests_weights():
    sig = {1: Hindsight("complaint", 0.9), 2: Hindsight("complaint", 0.9), 3: Hindsight("thanks", 0.8),
           4: Hindsight("new_topic", 0.5), 5: Hindsight("reask", 0.3), 6: NONE, 7: None, 8: Hindsight("thanks", 1)}
    votes = {1: -1, 2: 1, 3: 1.0, 4: -1, 5: -1, 6: 1, 7: 1, 9: 1, 8: 0}   # 8: 0 is no vote
    r = calibrate(sig, votes)
    assert set(r) == {"complaint", "reask", "thanks", "new_topic", "all"}
    assert (r["complaint"].count, r["complaint"].agree, r["complaint"].accuracy) == (2, 1, 0.5)
    assert (r["thanks"].count, r["thanks"].agree) == (1, 1) and (r["new_topic"].count, r["new_topic"].agree) == (1, 0)
    assert (r["all"].count, r["all"].agree) == (5, 3)
    assert r["reask"].mean_vote == -1.0 and r["reask"].lift == pytest.approx(-1.0 - 2 / 8)  # 8 votes, mean +0.25
    assert all(a.weight == 0.0 for a in r.values())   # 5 turns prove nothing at 95%
    assert calibrate(sig, votes, min_confidence=0.6)["reask"].count == 0
    empty = calibrate({}, {})
    assert empty["all"].count == 0 and math.isnan(empty["all"].accuracy) and empty["all"].weight == 0.0
    many = calibrate([(i, Hindsight("complaint", 1.0)) for i in range(400)], {i: -1 for i in range(400)},
                     thumbs_weight=0.5)
    assert 0.48 < many["complaint"].weight <= 0.5


@given(st.lists(st.tuples(st.integers(0, 30), st.sampled_from(KINDS), st.floats(0, 1)), max_size=60),
       st.dictionaries(st.integers(0, 30), st.one_of(st.floats(allow_nan=True), st.integers(-2, 2), st.none())))
@settings(max_examples=150, deadline=None)
def test_calibrate_is_total(sigs, votes):
    r = calibrate([(k, Hindsight(kind, c)) for k, kind, c in sigs], votes)
    for a in r.values():
        assert 0 <= a.agree <= a.count and 0.0 <= a.weight <= 1.0
        assert a.count == 0 or 0.0 <= a.accuracy_low <= a.accuracy <= 1.0
    assert r["all"].count == sum(a.count for k, a in r.items() if k != "all")


def test_hindsight_agrees_with_votes_on_realistic_simulated_traffic(caplog):
    """Users who vote on every turn but otherwise behave realistically: the kinds agree with their
    votes as documented (docs/learning.md "Realistic users"), and the log says so."""
    pool = families()["concise"].prompts("train")
    rng, sig, votes = random.Random(0), {}, {}
    for n in range(1500):
        s = Session.start(pool, pool[rng.randrange(len(pool))], UserModel.realistic(1.0), random.Random(n))
        while not s.done:
            s.observe(f"Reply {rng.randrange(10**6)}.", rng.random() < 0.3)
        for t, h in zip(s.turns, trace_hindsight([(t.request, t.reply) for t in s.turns])):
            sig[(n, t.turn_index)] = h
            votes[(n, t.turn_index)] = next(g.value for g in t.signals if g.kind == "thumbs")
    r = calibrate(sig, votes)
    assert r["complaint"].accuracy >= 0.95 and r["thanks"].accuracy >= 0.95 and r["reask"].accuracy >= 0.7, r
    assert r["complaint"].weight > 0.8 and r["thanks"].weight > 0.8 and r["reask"].weight > 0.3
    assert r["new_topic"].weight == 0.0      # moving on says little when most disliked replies get silence
    with caplog.at_level(logging.INFO, logger="tracerl.reward.hindsight"):
        text = log_calibration(r)
    assert text == format_calibration(r) and "complaint" in caplog.text and "weight" in caplog.text
