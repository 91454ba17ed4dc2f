"""Explicit positives lift the dodge cap (issue #13), through the SQL engine and the reference alike.

A liked reply that ends with a follow-up question used to score min(total, -0.25): below a neutral
answer, so the learner could never pick up that preference. Now an explicit positive (thumbs up,
rating above the middle, accept / edit kept) keeps the ordinary weighted sum; implicit credit
(session success, a satisfied follow-up) still does not lift the cap, and broken tools still cost.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_lake import end, fb, land, now, tool, turn
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS
from pipelines.reward import reference, rules
from pipelines.reward.engine import run_rewards
from pipelines.lake.tables import COMPONENTS
from pipelines.reward.spec import SpecBook

LATE = now(6 * 3600)  # every window has passed
QUESTION = "Want me to also check the delivery date?"
CAP = -0.25
ALWAYS_CAPPED = SpecBook({"default": {"dodge": {"explicit_overrides": False}}})
KEYS = ["tenant", "trace_id", "turn_id", "turn_index", "turn_time", *COMPONENTS, "dodge", "labelled", "total",
        "settled", "settle_at", "settle_reason", "spec_version"]


def _row(r: dict) -> tuple:
    return tuple(round(r[k], 12) if isinstance(r[k], float) else r[k] for k in KEYS)


def engine_and_reference(root: Path, events: list, book: SpecBook) -> dict[str, dict]:
    """Land `events`, run the SQL engine, assert the reference agrees row for row; rows by turn id."""
    land(root, events)
    got = run_rewards(root, book, now=LATE).tables
    _, files = delta.files(root, EVENTS)
    want = reference.compute(reference.read_signals(files), book, LATE)
    sql_rows = got.settled.to_pylist() + got.provisional.to_pylist()
    assert sorted(map(_row, sql_rows)) == sorted(map(_row, want.settled + want.provisional))
    return {r["turn_id"]: r for r in sql_rows}


def case(turn_id: str, text: str, *signals) -> list:
    """One turn in its own trace (so session credit goes to it alone) plus its signals."""
    return [turn(turn_id, text=text, trace_id=f"tr-{turn_id}"),
            *[s(turn_id, f"tr-{turn_id}") for s in signals]]


thumbs_up = lambda t, tr: fb(t, "thumbs", value=1, trace_id=tr)  # noqa: E731
thumbs_down = lambda t, tr: fb(t, "thumbs", value=-1, t=20, trace_id=tr)  # noqa: E731
satisfied = lambda t, tr: fb(t, "follow_up", text="thanks", sentiment="satisfied", trace_id=tr)  # noqa: E731
success = lambda t, tr: end(100, success=True, trace_id=tr)  # noqa: E731
broken = lambda t, tr: tool(t, "invalid_arguments", trace_id=tr)  # noqa: E731
ok_call = lambda t, tr: tool(t, "ok", trace_id=tr)  # noqa: E731

CASES = [  # (turn, text, signals, dodge, total under the default spec, total when always capped)
    ("liked-question", QUESTION, [thumbs_up], "clarify", 1.0, CAP),
    ("liked-silence", "", [thumbs_up], "silent", 1.0, CAP),
    ("rated-question", QUESTION, [lambda t, tr: fb(t, "rating", value=4, trace_id=tr)], "clarify", 0.5, CAP),
    ("accepted-question", QUESTION, [lambda t, tr: fb(t, "accept", trace_id=tr)], "clarify", 0.75, CAP),
    ("edited-question", QUESTION, [lambda t, tr: fb(t, "edit", text="x", trace_id=tr)], "clarify", 0.1875, CAP),
    ("liked-regenerated", QUESTION, [thumbs_up, lambda t, tr: fb(t, "regenerate", trace_id=tr)],
     "clarify", 0.5, CAP),
    ("liked-then-disliked", QUESTION, [thumbs_up, thumbs_down], "clarify", -1.0, -1.0),  # last wins: not liked
    ("implicit-only", QUESTION, [satisfied, success], "clarify", CAP, CAP),   # 1.0 before the cap
    ("middle-rating", QUESTION, [lambda t, tr: fb(t, "rating", value=3, trace_id=tr), success],
     "clarify", CAP, CAP),
    ("rejected-but-successful", QUESTION, [lambda t, tr: fb(t, "reject", trace_id=tr), success],
     "clarify", -0.25, -0.25),
    ("unlabelled-question", QUESTION, [], "clarify", CAP, CAP),
    ("liked-broken-tool", QUESTION, [thumbs_up, broken], None, 0.0, 0.0),     # a tool call is not a dodge
    ("liked-ok-tool", QUESTION, [thumbs_up, ok_call], None, 1.0, 1.0),
    ("neutral-answer", "Your order ships tomorrow.", [], None, None, None),
    ("middle-rated-answer", "Your order ships tomorrow.", [lambda t, tr: fb(t, "rating", value=3, trace_id=tr)],
     None, 0.0, 0.0),
]


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> dict[str, dict[str, dict]]:
    events = [e for name, text, signals, *_ in CASES for e in case(name, text, *signals)]
    return {which: engine_and_reference(tmp_path_factory.mktemp(which) / "lake", events, book)
            for which, book in (("default", SpecBook()), ("always_capped", ALWAYS_CAPPED))}


@pytest.mark.parametrize("name, text, signals, dodge, total, capped_total", CASES, ids=[c[0] for c in CASES])
def test_dodge_totals_engine_equals_reference(scored, name, text, signals, dodge, total, capped_total):
    for which, want in (("default", total), ("always_capped", capped_total)):
        r = scored[which][name]
        assert r["dodge"] == dodge
        assert r["total"] == pytest.approx(want) if want is not None else r["total"] is None, which


def test_a_liked_question_scores_above_a_neutral_answer_and_above_zero(scored):
    rows = scored["default"]
    liked = rows["liked-question"]["total"]
    neutral = [rows["neutral-answer"]["total"] or 0.0, rows["middle-rated-answer"]["total"]]
    assert liked > 0 and all(liked > n for n in neutral)
    assert scored["always_capped"]["liked-question"]["total"] < min(neutral)   # the failure #13 measured


def test_implicit_positives_leave_a_question_at_the_cap(scored):
    r = scored["default"]["implicit-only"]
    assert r["session"] == 1.0 and r["follow_up"] == 1.0
    assert r["total"] <= CAP


def test_a_liked_reply_that_broke_a_tool_stays_below_a_liked_reply_whose_tool_worked(scored):
    rows = scored["default"]
    assert rows["liked-broken-tool"]["total"] < rows["liked-ok-tool"]["total"]
    assert rows["liked-broken-tool"]["total"] < rows["liked-question"]["total"]


# -- property: any feedback on dodge turns, SQL == reference, and no explicit positive => <= cap ----
TEXTS = ["", "  ", "Which one?", "Done.", "x" * 400 + "?"]
feedback = st.one_of(
    st.builds(lambda v, t: ("thumbs", dict(value=v, t=t)), st.sampled_from([-1, 0, 1, 2]), st.integers(5, 50)),
    st.builds(lambda v, t: ("rating", dict(value=v, t=t)), st.integers(1, 5), st.integers(5, 50)),
    st.builds(lambda k, t: (k, dict(t=t)), st.sampled_from(["accept", "reject", "regenerate"]), st.integers(5, 50)),
    st.builds(lambda t: ("edit", dict(text="x", t=t)), st.integers(5, 50)),
    st.builds(lambda s, t: ("follow_up", dict(text="hm", sentiment=s, t=t)),
              st.sampled_from(["satisfied", "neutral", "dissatisfied"]), st.integers(5, 50)),
)
one_turn = st.fixed_dictionaries({
    "text": st.sampled_from(TEXTS), "feedback": st.lists(feedback, max_size=3),
    "tools": st.lists(st.sampled_from(["ok", "timeout", "error", "invalid_arguments"]), max_size=2),
    "session": st.one_of(st.none(), st.sampled_from([("completed", True), ("completed", False),
                                                     ("abandoned", None)])),
})
books = st.sampled_from([SpecBook(), ALWAYS_CAPPED,
                         SpecBook({"default": {"dodge": {"cap": -0.5}, "credit": {"rule": "uniform"}}})])


def build(turns: list[dict]) -> list:
    events = []
    for i, spec in enumerate(turns):
        tid, tr = f"t{i}", f"tr-{i}"
        events.append(turn(tid, text=spec["text"], trace_id=tr))
        events += [fb(tid, kind, trace_id=tr, **kw) for kind, kw in spec["feedback"]]
        events += [tool(tid, o, t=1 + j, trace_id=tr) for j, o in enumerate(spec["tools"])]
        if spec["session"]:
            events.append(end(100, spec["session"][0], success=spec["session"][1], trace_id=tr))
    return events


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(one_turn, min_size=1, max_size=8), book=books)
def test_any_signals_on_dodge_turns_engine_equals_reference(turns, book):
    with tempfile.TemporaryDirectory() as tmp:
        rows = engine_and_reference(Path(tmp) / "lake", build(turns), book)
    for r in rows.values():
        if r["dodge"] is None:
            continue
        spec = book.resolve(r["tenant"], r["task"])
        assert r["labelled"] and r["total"] is not None
        if not (spec.dodge.explicit_overrides and rules.explicit_positive(r)):
            assert r["total"] <= spec.dodge.cap
        else:
            assert r["total"] == pytest.approx(rules.combine(r, None, spec)[1])
