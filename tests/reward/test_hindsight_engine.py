"""Hindsight signals in the reward engine, on a real lake: the next user message of the trace labels
the previous turn (complaint, re-ask: negative; thanks: positive), never outweighs an explicit vote,
never counts twice beside a regenerate or a follow-up sentiment, never lifts the dodge cap, waits
for its next turn while the turn is open, and each run calibrates it against the votes."""

from __future__ import annotations

import logging

import duckdb
import pytest

from reward_lake import events_table, fb, land, now, turn
from pipelines.ingest.decode import hot_fields
from pipelines.lake.tables import HOT_COLUMNS
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS
from pipelines.lake.query import register_reward_views
from pipelines.reward.engine import run_rewards
from pipelines.reward.hindsight import classify
from pipelines.reward.spec import SpecBook

LATE = now(6 * 3600)  # every window has passed
Q = "How do I reset my router password?"
A = "Hold the reset button for ten seconds, then log in with the default password."
W = 0.25  # the default spec's hindsight weight


def rows(root) -> dict[str, dict]:
    con = register_reward_views(duckdb.connect(), root)
    return {r["turn_id"]: r for r in con.sql("SELECT * FROM rewards").to_arrow_table().to_pylist()}


def pair(trace: str, nxt: str, *extra, first_text: str = A) -> list:
    """Turn `<trace>-1` answering Q, then turn `<trace>-2` whose user message is `nxt`."""
    return [turn(f"{trace}-1", 0, 0, text=first_text, user=Q, trace_id=trace),
            turn(f"{trace}-2", 1, 60, user=nxt, trace_id=trace), *extra]


@pytest.mark.parametrize("nxt, kind, sign", [
    ("That's wrong, the button does nothing.", "complaint", -1),
    ("How can I reset the router password?", "reask", -1),
    ("Thanks, that worked!", "thanks", 1),
])
def test_the_next_message_labels_the_previous_unlabelled_turn(lake_root, nxt, kind, sign):
    h = classify(nxt, Q, A)
    assert h.kind == kind and h.confidence >= 0.6
    land(lake_root, pair("tr", nxt))
    run_rewards(lake_root, now=LATE)
    got = rows(lake_root)
    first, second = got["tr-1"], got["tr-2"]
    assert first["labelled"] and first["settled"]
    assert first["hindsight"] == pytest.approx(h.value) and (first["hindsight"] > 0) == (sign > 0)
    assert first["total"] == pytest.approx(W * h.value)
    assert all(first[c] is None for c in ("thumbs", "rating", "output", "regenerate", "follow_up"))
    assert second["hindsight"] is None and not second["labelled"]   # nothing after it: no signal


def test_moving_on_is_no_signal_by_default_and_a_knob_turns_it_on(lake_root, tmp_path):
    nxt = "What is the capital of Peru?"
    assert classify(nxt, Q, A).kind == "new_topic"
    land(lake_root, pair("tr", nxt))
    run_rewards(lake_root, now=LATE)
    assert rows(lake_root)["tr-1"]["hindsight"] is None and not rows(lake_root)["tr-1"]["labelled"]
    other = tmp_path / "other"
    land(other, pair("tr", nxt))
    run_rewards(other, SpecBook({"default": {"hindsight": {"new_topic": 0.5}}}), now=LATE)
    assert rows(other)["tr-1"]["hindsight"] == pytest.approx(0.5 * classify(nxt, Q, A).confidence)


def test_an_explicit_vote_outweighs_hindsight(lake_root):
    land(lake_root, pair("up", "That's wrong, the button does nothing.", fb("up-1", "thumbs", value=1, trace_id="up"))
         + pair("down", "Thanks, that worked!", fb("down-1", "thumbs", value=-1, trace_id="down")))
    run_rewards(lake_root, now=LATE)
    got = rows(lake_root)
    up, down = got["up-1"], got["down-1"]
    assert up["hindsight"] < 0 and up["total"] == pytest.approx(1.0 + W * up["hindsight"]) and up["total"] > 0.5
    assert down["hindsight"] > 0 and down["total"] == pytest.approx(-1.0 + W * down["hindsight"]) \
        and down["total"] < -0.5


def test_no_double_counting_beside_regenerate_or_follow_up_sentiment(lake_root):
    land(lake_root,
         pair("rg", Q, fb("rg-1", "regenerate", trace_id="rg"))                        # a regenerate: re-ask
         + pair("fu", "That's wrong, the button does nothing.",
                fb("fu-1", "follow_up", text="wrong", sentiment="dissatisfied", trace_id="fu"))
         + pair("ty", "Thanks, that worked!",
                fb("ty-1", "follow_up", text="thanks", sentiment="satisfied", trace_id="ty"))
         + pair("nf", "Thanks, that worked!",                                              # neutral: counts
                fb("nf-1", "follow_up", text="thanks", sentiment="neutral", trace_id="nf"))
         + pair("rc", "That's wrong, the button does nothing.", fb("rc-1", "regenerate", trace_id="rc")))
    run_rewards(lake_root, now=LATE)
    got = rows(lake_root)
    assert got["rg-1"]["hindsight"] is None and got["rg-1"]["total"] == pytest.approx(-0.5)
    assert got["fu-1"]["hindsight"] is None and got["fu-1"]["total"] == pytest.approx(-0.5)
    assert got["ty-1"]["hindsight"] is None and got["ty-1"]["total"] == pytest.approx(0.5)
    assert got["nf-1"]["hindsight"] > 0 and got["nf-1"]["total"] == pytest.approx(W * got["nf-1"]["hindsight"])
    # a complaint beside a regenerate is other evidence (what was wrong), so both count
    assert got["rc-1"]["hindsight"] < 0 and got["rc-1"]["total"] == pytest.approx(-0.5 + W * got["rc-1"]["hindsight"])


def test_hindsight_never_lifts_the_dodge_cap(lake_root):
    land(lake_root, pair("dq", "Thanks, that worked!", first_text="Which router model do you have?"))
    run_rewards(lake_root, now=LATE)
    first = rows(lake_root)["dq-1"]
    assert first["dodge"] == "clarify" and first["hindsight"] > 0 and first["total"] == pytest.approx(-0.25)


def test_an_open_turn_waits_for_its_next_turn(lake_root):
    land(lake_root, [turn("w-1", 0, 0, text=A, user=Q, trace_id="w")])
    run_rewards(lake_root, now=now(600))
    assert rows(lake_root)["w-1"]["hindsight"] is None and not rows(lake_root)["w-1"]["settled"]
    # the next turn comes in a later run, still inside the first turn's window
    land(lake_root, [turn("w-2", 1, 1200, user="That's wrong, the button does nothing.", trace_id="w")])
    run_rewards(lake_root, now=now(1800))
    assert rows(lake_root)["w-1"]["hindsight"] < 0 and not rows(lake_root)["w-1"]["settled"]
    run_rewards(lake_root, now=LATE)
    first = rows(lake_root)["w-1"]
    assert first["settled"] and first["hindsight"] < 0 and first["total"] == pytest.approx(W * first["hindsight"])
    # a next turn after the window: the turn settled without it, and stays so
    land(lake_root, [turn("x-1", 0, 7 * 3600, text=A, user=Q, trace_id="x")])
    run_rewards(lake_root, now=now(9 * 3600))
    land(lake_root, [turn("x-2", 1, 10 * 3600, user="Thanks, that worked!", trace_id="x")])
    run_rewards(lake_root, now=now(20 * 3600))
    assert rows(lake_root)["x-1"]["hindsight"] is None and rows(lake_root)["x-1"]["settled"]


def test_each_run_calibrates_hindsight_against_the_votes(lake_root, caplog):
    complaint = "That's wrong, the button does nothing."
    events = []
    for i in range(3):   # complaints on thumbs-down turns: agree
        events += pair(f"c{i}", complaint, fb(f"c{i}-1", "thumbs", value=-1, trace_id=f"c{i}"))
    events += pair("c9", complaint, fb("c9-1", "thumbs", value=1, trace_id="c9"))      # disagrees
    events += pair("t0", "Thanks, that worked!", fb("t0-1", "rating", value=5, trace_id="t0"))  # a rating votes too
    events += pair("n0", "Thanks, that worked!")                                        # no vote: not counted
    land(lake_root, events)
    with caplog.at_level(logging.INFO, logger="tracerl.reward.hindsight"):
        result = run_rewards(lake_root, now=LATE)
    cal = result.hindsight_calibration
    assert (cal["complaint"].count, cal["complaint"].agree) == (4, 3)
    assert (cal["thanks"].count, cal["thanks"].agree) == (1, 1)
    assert cal["reask"].count == 0 and (cal["all"].count, cal["all"].agree) == (5, 4)
    assert cal["complaint"].accuracy == pytest.approx(0.75) and 0 <= cal["complaint"].weight <= 1
    assert result.tables.hindsight_calibration == cal
    assert any("hindsight vs explicit votes" in r.getMessage() for r in caplog.records)
    # a run that settles nothing calibrates nothing
    assert run_rewards(lake_root, now=LATE).hindsight_calibration == {}


def test_events_without_the_user_text_column_read_null(lake_root):
    """Files of a release before `user_text`: no hindsight from them, and the run still binds."""
    old = events_table(pair("old", "Thanks, that worked!")).drop_columns(["user_text"])
    delta.append(lake_root, EVENTS, old)
    run_rewards(lake_root, now=now(60))
    assert rows(lake_root)["old-1"]["hindsight"] is None
    land(lake_root, pair("new", "Thanks, that worked!"))   # the column joins the table's schema
    run_rewards(lake_root, now=LATE)
    got = rows(lake_root)
    assert got["old-1"]["hindsight"] is None and got["old-1"]["settled"]
    assert got["new-1"]["hindsight"] > 0


def test_ingest_stores_the_last_user_message_of_a_model_turn():
    t = turn("a", user="first").to_dict()
    t["input_messages"] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"},
                           {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"},
                           {"role": "tool", "content": "result"}]
    at = [name for name, _ in HOT_COLUMNS].index("user_text")
    assert hot_fields(t)[at] == "q2"
    t["input_messages"] = [{"role": "system", "content": "be brief"}]
    assert hot_fields(t)[at] is None
    assert hot_fields(fb("a", "thumbs", value=1).to_dict())[at] is None


def test_reward_tables_of_a_release_before_hindsight_still_read(lake_root, monkeypatch):
    """Rewards, provisional snapshots without the `hindsight` column (a release before it): the views,
    the next run and the drift check read NULL there."""
    from pipelines.reward import checks, engine
    real = engine.compute

    def before(*args, **kw):
        out = real(*args, **kw)
        out.settled, out.provisional = (t.drop_columns(["hindsight"]) for t in (out.settled, out.provisional))
        return out

    monkeypatch.setattr(engine, "compute", before)
    land(lake_root, [turn("a", 0, 0), fb("a", "thumbs", value=1), turn("b", 0, 5000, trace_id="tr-2")])
    run_rewards(lake_root, now=now(7200))
    monkeypatch.undo()
    got = rows(lake_root)
    assert got["a"]["hindsight"] is None and got["a"]["settled"] and not got["b"]["settled"]
    land(lake_root, [fb("a", "thumbs", value=-1, t=7300), turn("c", 1, 7400, user="Thanks, that worked!",
                                                                  trace_id="tr-2")])
    result = run_rewards(lake_root, now=LATE)
    assert result.committed and result.corrections == {"after_settle": 1}
    got = rows(lake_root)
    assert got["b"]["settled"] and got["b"]["hindsight"] > 0
    assert all(c.passed or c.name == "unlabelled_share" for c in checks.evaluate(lake_root, result, SpecBook()))


def test_the_spec_checks_its_hindsight_knobs():
    spec = SpecBook().resolve("*", None)
    assert spec.weights.hindsight == W and spec.hindsight.new_topic == 0 and spec.hindsight.min_confidence == 0.6
    assert spec.weights.hindsight * 1.0 < spec.weights.thumbs / 2   # a vote always wins
    for bad, msg in [({"thanks": 2}, "hindsight.thanks"), ({"min_confidence": 1.5}, "hindsight.min_confidence"),
                     ({"sarcasm": -1}, "unknown key")]:
        with pytest.raises(ValueError, match=msg):
            SpecBook({"default": {"hindsight": bad}})
    assert SpecBook({"default": {"hindsight": {"reask": -0.5}}}).resolve("*", None).version_id != spec.version_id
