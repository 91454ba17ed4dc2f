"""Tool outcomes read from the conversation (``pipelines.deploy.tool_results``): which answers are
ours, how each outcome is judged, and that no message a client can send breaks the judging."""

from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.deploy import schemas
from pipelines.deploy.tool_results import call_id, calling_turn, judge, tool_results

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}


def request(calls: list[tuple[str, dict]], results: list[str], tools=(WEATHER,)) -> schemas.ChatRequest:
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(a)}}
                for cid, a in calls]},
            *({"role": "tool", "tool_call_id": cid, "content": r} for (cid, _), r in zip(calls, results))]
    return schemas.parse(schemas.ChatRequest, {"model": "m", "messages": msgs, "tools": list(tools)})


def results_of(req: schemas.ChatRequest, ours=lambda turn: turn.startswith("good")):
    return tool_results(req.messages, req.tool_dicts(), ours)


def test_call_ids_name_their_turn():
    assert calling_turn(call_id(3, "abc-123")) == "abc-123"
    assert calling_turn("call_1") is None and calling_turn("call_x_abc") is None and calling_turn("toolu_01") is None


def test_each_answer_is_judged_by_the_tools_schema_and_its_result():
    req = request([(call_id(0, "good-1"), {"city": "Oslo"}), (call_id(1, "good-1"), {"town": "Oslo"}),
                   (call_id(2, "good-1"), {"city": "Atlantis"}), (call_id(3, "good-1"), {"city": "Rome"})],
                  [json.dumps({"temp_c": 4}), "{}", json.dumps({"error": {"code": 404}}), "It is raining."])
    found, foreign = results_of(req)
    assert foreign == 0
    assert [(r.turn_id, r.outcome) for r in found] == [("good-1", "ok"), ("good-1", "invalid_arguments"),
                                                       ("good-1", "error"), ("good-1", "ok")]
    assert "city" in found[1].error and found[2].error == '{"code": 404}'
    assert found[0].event_id == "result-call_0_good-1" and found[0].arguments == {"city": "Oslo"}


def test_answers_to_calls_not_ours_are_counted_not_recorded():
    req = request([("call_1", {"city": "Oslo"}), (call_id(0, "forged-1"), {"city": "Oslo"}),
                   (call_id(1, "good-2"), {"city": "Oslo"})], ["{}", "{}", "{}"])
    found, foreign = results_of(req)
    assert [r.call_id for r in found] == ["call_1_good-2"] and foreign == 2


def test_a_call_to_a_tool_the_request_does_not_send_is_invalid():
    req = request([(call_id(0, "good-1"), {"city": "Oslo"})], ["{}"], tools=())
    (r,), _ = results_of(req)
    assert r.outcome == "invalid_arguments" and "unknown tool" in r.error


def test_a_tool_whose_schema_runs_regexes_has_only_its_name_checked():
    """A client's pattern is never run on the event loop: ``(a+)+$`` on 40 a's and a b would backtrack
    for hours (2^40 paths); judged by name only, it returns at once."""
    evil = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "pattern": "^(a+)+$"}}}}}
    t0 = time.perf_counter()
    outcome, error = judge("get_weather", {"city": "a" * 40 + "b"}, "{}", [evil])
    assert (outcome, error) == ("ok", None) and time.perf_counter() - t0 < 5
    assert judge("get_time", {}, "{}", [evil])[0] == "invalid_arguments"


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.one_of(st.text(min_size=1, max_size=40), st.builds(call_id, st.integers(0, 9999),
                                                                           st.text(min_size=1, max_size=30))),
                    min_size=1, max_size=4, unique=True),
       args=st.dictionaries(st.text(max_size=6), _json, max_size=3),
       result=st.one_of(st.text(max_size=50), _json.map(json.dumps)))
def test_any_answer_a_client_sends_is_judged_or_counted_never_a_crash(ids, args, result):
    req = request([(i, args) for i in ids], [result] * len(ids))
    found, foreign = results_of(req, ours=lambda turn: True)
    assert len(found) + foreign == len(ids)
    assert {r.call_id for r in found} == {i for i in ids if calling_turn(i) is not None}
    assert all(r.outcome in ("ok", "error", "invalid_arguments") for r in found)
