"""Golden tables for the pure reward rules and the spec (no lake, no SQL)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from pipelines.reward import rules
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.lake.tables import COMPONENTS
from pipelines.reward.spec import (
    Discounted,
    Dodge,
    LastTurn,
    RewardSpec,
    SpecBook,
    Tools,
    Uniform,
    Weights,
    load_spec_book,
)

SPEC = RewardSpec()


@pytest.mark.parametrize("value, want", [(1, 1.0), (-1, -1.0), (0, None), (None, None), (3, 1.0)])
def test_thumbs(value, want):
    assert rules.thumbs(value) == want


@pytest.mark.parametrize("value, lo, hi, want", [
    (5, None, None, 1.0), (1, None, None, -1.0), (3, None, None, 0.0), (4, 1, 5, 0.5),
    (2, 0, 10, -0.6), (10, 0, 10, 1.0), (7, 5, 5, None),       # a broken scale is no signal
    (50, 1, 5, 23.5),                                           # out of scale: NOT clamped, the bounds check sees it
])
def test_rating_scaled_to_unit_interval(value, lo, hi, want):
    got = rules.rating(value, lo, hi, SPEC)
    assert got == pytest.approx(want) if want is not None else got is None


@pytest.mark.parametrize("kind, want", [("accept", 1.0), ("edit", 0.25), ("reject", -1.0), (None, None)])
def test_output_fate(kind, want):
    assert rules.output(kind, SPEC) == want


@pytest.mark.parametrize("sentiment, want", [("dissatisfied", -1.0), ("satisfied", 1.0), ("neutral", None),
                                             (None, None)])
def test_follow_up(sentiment, want):
    assert rules.follow_up(sentiment, SPEC) == want


def test_regenerate_is_presence():
    assert rules.regenerate(True, SPEC) == -1.0 and rules.regenerate(False, SPEC) is None


@pytest.mark.parametrize("outcomes, want", [
    ([], None), (["ok"], 0.0), (["timeout"], -0.25), (["error"], -0.5), (["invalid_arguments"], -1.0),
    (["ok", "ok", "ok", "invalid_arguments"], -1.0),   # worst wins: ok calls cannot dilute a broken one
    (["error", "ok"], -0.5), (["teleported"], None),
])
def test_tool_worst_outcome(outcomes, want):
    assert rules.tool(outcomes, SPEC) == want


@pytest.mark.parametrize("retries, calls, want", [(0, 0, None), (0, 1, 0.0), (1, 2, -1 / 3), (5, 6, -1.0)])
def test_retries(retries, calls, want):
    got = rules.retries(retries, calls, SPEC)
    assert got == pytest.approx(want) if want is not None else got is None


def test_cost_terms_off_by_default_and_capped_when_on():
    assert rules.latency(5000, SPEC) is None and rules.length(100, SPEC) is None
    on = RewardSpec(weights=Weights(latency=0.2, length=0.1))
    assert rules.latency(5000, on) == -0.5 and rules.latency(99_999, on) == -1.0
    assert rules.length(1000, on) == -0.25 and rules.length(10**6, on) == -1.0


@pytest.mark.parametrize("text, want", [("", "empty"), ("  \n\t", "empty"), ("Which order?", "question"),
                                        ("Which order?  \n", "question"), ("Done.", None),
                                        ("Is it? No, it is done.", None)])
def test_text_class(text, want):
    assert rules.text_class(text) == want


@pytest.mark.parametrize("cls, chars, calls, want", [
    ("empty", 0, 0, "silent"), ("question", 20, 0, "clarify"), ("question", 301, 0, None),
    ("empty", 0, 1, None),            # a tool-only turn acted: not silent
    ("question", 20, 1, None), (None, 20, 0, None),
])
def test_dodge(cls, chars, calls, want):
    assert rules.dodge(cls, chars, calls, SPEC) == want


# -- credit assignment: every rule, golden -----------------------------------------------------
@pytest.mark.parametrize("credit, last, want", [
    (LastTurn(), 2, [None, None, 1.0]),
    (Uniform(), 2, [1.0, 1.0, 1.0]),
    (Discounted(gamma=0.5, min_share=0.05), 2, [0.25, 0.5, 1.0]),
    (Discounted(gamma=0.5, min_share=0.05), 5, [None, 0.0625, 0.125, 0.25, 0.5, 1.0]),  # 1/32 < min_share
    (Discounted(gamma=1.0, min_share=0.0), 2, [1.0, 1.0, 1.0]),
])
def test_session_credit_rules(credit, last, want):
    spec = RewardSpec(credit=credit)
    assert [rules.session_share(i, last, spec) for i in range(last + 1)] == want


@pytest.mark.parametrize("outcome, success, want", [
    ("abandoned", None, (-1.0, None)), ("completed", True, (None, 1.0)), ("completed", False, (None, -1.0)),
    ("completed", None, (None, None)), ("abandoned", False, (-1.0, -1.0)),
])
def test_session_values(outcome, success, want):
    assert rules.session_values(outcome, success, SPEC) == want


# -- combining: labels, totals, the anti-hack defaults ------------------------------------------
def comps(**kw):
    return {c: kw.get(c) for c in COMPONENTS}


@pytest.mark.parametrize("kw, dodge, want", [
    ({}, None, (False, None)),                                    # no signal: unlabelled, never 0
    ({"tool": 0.0, "retries": 0.0}, None, (False, None)),         # an ok call alone carries no preference
    ({"latency": -0.5}, None, (False, None)),                     # cost terms never label
    ({"tool": -1.0, "retries": 0.0}, None, (True, -1.0)),         # a broken call labels the turn, negative
    ({"thumbs": 1.0, "tool": -0.5}, None, (True, 0.5)),
    ({"rating": 0.0}, None, (True, 0.0)),                         # a middle rating IS a label of 0
    ({"output": 1.0, "follow_up": -1.0}, None, (True, 0.25)),
    ({}, "silent", (True, -0.25)),                                # silence is labelled at the cap
    ({"session": 1.0, "follow_up": 1.0}, "clarify", (True, -0.25)),  # implicit credit never lifts the cap
    ({"thumbs": -1.0}, "clarify", (True, -1.0)),                  # ...and a worse score is kept
    ({"thumbs": 1.0}, "clarify", (True, 1.0)),                    # a LIKED question keeps its sum
    ({"output": 0.25}, "clarify", (True, 0.1875)),                # an edit kept is acting on the reply
    ({"rating": 0.0, "session": 1.0}, "clarify", (True, -0.25)),  # a middle rating is no explicit positive
])
def test_combine(kw, dodge, want):
    labelled, total = rules.combine(comps(**kw), dodge, SPEC)
    assert labelled == want[0]
    assert total == pytest.approx(want[1]) if want[1] is not None else total is None


FEEDBACK = [{}, {"thumbs": 1.0}, {"thumbs": -1.0}, {"output": 1.0}, {"output": -1.0}, {"rating": 0.5},
            {"follow_up": -1.0}, {"regenerate": -1.0}, {"thumbs": 1.0, "output": 1.0}]


@pytest.mark.parametrize("fb", FEEDBACK)
@pytest.mark.parametrize("broken", ["timeout", "error", "invalid_arguments"])
def test_broken_tool_call_is_never_free(fb, broken):
    """Whatever the feedback: broken call < correct call, and broken call < no call at all."""
    def total(outcomes):
        c = comps(**fb, tool=rules.tool(outcomes, SPEC), retries=rules.retries(0, len(outcomes), SPEC))
        labelled, t = rules.combine(c, None, SPEC)
        return t if labelled else 0.0  # compare an unlabelled turn at its most generous value
    assert total([broken]) < total(["ok"])
    assert total([broken]) < total([])


ALWAYS_CAPPED = RewardSpec(dodge=Dodge(explicit_overrides=False))   # the behaviour before issue #13
IMPLICIT = [{}, {"session": 1.0}, {"follow_up": 1.0}, {"session": 1.0, "follow_up": 1.0, "abandon": None},
            {"rating": 0.0, "session": 1.0}, {"output": -1.0, "follow_up": 1.0}, {"thumbs": -1.0, "session": 1.0}]


@pytest.mark.parametrize("fb", FEEDBACK + IMPLICIT)
@pytest.mark.parametrize("dodge", ["silent", "clarify"])
def test_dodging_never_beats_the_cap_when_always_capped(fb, dodge):
    _, t = rules.combine(comps(**fb), dodge, ALWAYS_CAPPED)
    assert t <= ALWAYS_CAPPED.dodge.cap < 0


@pytest.mark.parametrize("fb", [f for f in FEEDBACK + IMPLICIT if not rules.explicit_positive(comps(**f))])
@pytest.mark.parametrize("dodge", ["silent", "clarify"])
def test_needless_questions_do_not_pay_without_an_explicit_positive(fb, dodge):
    """Cursor's hack: a question instead of a risky answer. Only the user's explicit 'yes' lifts the cap."""
    _, t = rules.combine(comps(**fb), dodge, SPEC)
    assert t <= SPEC.dodge.cap < 0


def test_a_liked_follow_up_question_beats_a_neutral_answer():
    """The measured failure of #13: liked replies ending with a question scored -0.25, below neutral."""
    liked = rules.combine(comps(thumbs=1.0), "clarify", SPEC)[1]
    neutral = [rules.combine(comps(), None, SPEC)[1] or 0.0,        # answered, no feedback (unlabelled)
               rules.combine(comps(rating=0.0), None, SPEC)[1]]      # answered, rated in the middle
    assert liked > 0 and all(liked > n for n in neutral)
    assert rules.combine(comps(thumbs=1.0), "clarify", ALWAYS_CAPPED)[1] == ALWAYS_CAPPED.dodge.cap


@pytest.mark.parametrize("broken", ["timeout", "error", "invalid_arguments"])
def test_a_liked_reply_that_broke_a_tool_is_below_a_liked_reply_whose_tool_worked(broken):
    def total(outcomes):
        c = comps(thumbs=1.0, tool=rules.tool(outcomes, SPEC), retries=rules.retries(0, len(outcomes), SPEC))
        return rules.combine(c, rules.dodge("question", 20, len(outcomes), SPEC), SPEC)[1]
    assert total([broken]) < total(["ok"]) and total([broken]) < total([])


_unit = st.one_of(st.none(), st.floats(-1, 1, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(c=st.fixed_dictionaries({k: _unit for k in COMPONENTS}), dodge=st.sampled_from(["silent", "clarify"]),
       cap=st.floats(-1, 0, allow_nan=False), overrides=st.booleans())
def test_a_dodge_without_explicit_positive_never_scores_above_the_cap(c, dodge, cap, overrides):
    spec = RewardSpec(dodge=Dodge(cap=cap, explicit_overrides=overrides))
    labelled, total = rules.combine(c, dodge, spec)
    assert labelled and total is not None
    if overrides and rules.explicit_positive(c):
        assert total == rules.combine(c, None, spec)[1]            # the ordinary weighted sum
    else:
        assert total <= cap


def test_explicit_overrides_is_validated_and_versioned():
    with pytest.raises(ValueError, match=r"explicit_overrides = 'yes' must be true or false"):
        SpecBook({"default": {"dodge": {"explicit_overrides": "yes"}}})
    assert RewardSpec().params()["dodge_explicit_overrides"] == 1 and ALWAYS_CAPPED.params()["dodge_explicit_overrides"] == 0
    assert RewardSpec().version_id != ALWAYS_CAPPED.version_id
    assert SpecBook({"default": {"dodge": {"explicit_overrides": False}}}).resolve("a", None) == ALWAYS_CAPPED


def test_total_bound_holds_for_extreme_components():
    for signs in itertools.product([-1.0, 1.0], repeat=4):
        c = comps(thumbs=signs[0], rating=signs[1], output=signs[2], session=signs[3], tool=-1.0, retries=-1.0,
                  abandon=-1.0, regenerate=-1.0, follow_up=-1.0)
        assert abs(rules.combine(c, None, SPEC)[1]) <= SPEC.total_bound


# -- the spec: validation, versions, TOML --------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"tools": Tools(error=0.0)}, "never score as well"),
    ({"tools": Tools(ok=0.2, timeout=0.1)}, "must be below"),
    ({"weights": Weights(tool=0.0)}, "free"),
    ({"weights": Weights(thumbs=-1.0)}, ">= 0"),
])
def test_spec_rejects_hackable_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RewardSpec(**kwargs)


def test_version_id_changes_with_any_value():
    a, b = RewardSpec(), RewardSpec(weights=Weights(thumbs=0.9))
    assert a.version_id.startswith("builtin-1+") and a.version_id != b.version_id
    assert RewardSpec().version_id == a.version_id


def test_overrides_resolve_per_tenant_and_task():
    book = SpecBook({"version": "v7", "default": {"weights": {"thumbs": 0.8}},
                     "tenant": {"acme": {"credit": {"rule": "last_turn"},
                                         "task": {"sql": {"dodge": {"cap": -0.5}}}}}})
    base, acme, sql = book.resolve("other", "x"), book.resolve("acme", "chat"), book.resolve("acme", "sql")
    assert base.weights.thumbs == acme.weights.thumbs == sql.weights.thumbs == 0.8
    assert isinstance(base.credit, Discounted) and isinstance(acme.credit, LastTurn) and isinstance(sql.credit, LastTurn)
    assert sql.dodge.cap == -0.5 and acme.dodge.cap == -0.25
    assert len({base.version_id, acme.version_id, sql.version_id}) == 3
    assert all(s.version.startswith("v7") for s in (base, acme, sql))


@pytest.mark.parametrize("doc, message", [
    ({"default": {"weights": {"thumb": 1}}}, "unknown key"),
    ({"default": {"credit": {"rule": "random"}}}, "choose one of"),
    ({"tenant": {"acme": {"tools": {"error": 0.5}}}}, r"tenant\.acme"),
    ({"defaults": {}}, "unknown top-level"),
])
def test_bad_toml_values_name_the_place_and_the_fix(doc, message):
    with pytest.raises(ValueError, match=message):
        SpecBook(doc)


def test_shipped_example_spec_parses():
    path = Path(__file__).resolve().parents[2] / "pipelines" / "reward" / "rewards.example.toml"
    book = load_spec_book(path)
    assert book.resolve("acme", "sql").dodge.cap == -0.5
    assert isinstance(book.resolve("globex", "code").credit, LastTurn)
