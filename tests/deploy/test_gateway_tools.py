"""OpenAI ``tools`` through the gateway: the request shape customer SDKs send, the tools rendered
into the prompt that is served and recorded, calls in the reply mapped to ``message.tool_calls``.

The door (schemas) and the reply mapping run in-process; the served path runs on the shared
``boundary`` gateway (tiny vLLM, real Kafka). The tiny model rarely writes a call, so the mapping
is pinned with the pure functions and the live test checks whatever the model wrote is mapped
the way ``tool_reply`` says.
"""

from __future__ import annotations

import json

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.contract.tool_calls import call_prefix, parse_tool_calls, tools_system_prompt, with_tools
from pipelines.deploy import schemas
from pipelines.deploy import errors as E
from pipelines.deploy.errors import ApiError
from pipelines.deploy.gateway import Gateway, tool_reply
from pipelines.deploy.service import GatewayClient
from tests.deploy.conftest import KEYS
from tests.deploy.gateway_http import call, is_openai_error
from tests.deploy.test_gateway import kafka_events

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Can you use a tool? What is the weather in Oslo?"}]


def body(**fields):
    return {"model": "support", "messages": ASK, "max_tokens": 24, "temperature": 0.0, **fields}


# -- the door, in-process -------------------------------------------------------------------------

@pytest.mark.parametrize("fields, param, code", [
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters", "invalid_parameters"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "y", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}]},
     "tools[1].function.parameters", "invalid_parameters"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name", None),
    ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools[0].type", None),
    ({"tools": [{"type": "function", "function": {"name": "x", "strict": True}}]}, "tools[0].function.strict",
     "unknown_parameter"),
    ({"tools": [WEATHER] * 65}, "tools", None),
    ({"tools": [WEATHER, WEATHER]}, "tools", "duplicate_tool"),
    ({"tool_choice": "required"}, "tool_choice", "tool_choice_without_tools"),
    ({"tools": [], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     "tool_choice", "tool_choice_without_tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "tool_choice", "unknown_tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get weather"}}},
     "tool_choice", "invalid_tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}}, "tool_choice",
     "invalid_tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice", "invalid_tool_choice"),
    ({"tools": [WEATHER], "tool_choice": ["required"]}, "tool_choice", "invalid_tool_choice"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}]},
     "messages[0].tool_calls[0].function.arguments", "invalid_arguments"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "missing"),
    ({"messages": [{"role": "assistant"}]}, "messages[0].content", "missing"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}}]}]},
     "messages[0].tool_calls", "tool_calls_role"),
])
def test_bad_tools_are_a_400_naming_the_field(fields, param, code):
    """``code`` is the finer reason (our validators' kinds, pydantic's); the answer's code is OpenAI's."""
    with pytest.raises(ApiError) as err:
        schemas.parse(schemas.ChatRequest, body(**fields))
    assert err.value.status == 400 and err.value.param == param and param in err.value.message
    assert err.value.code in E.OPENAI_CODES
    assert code is None or code in (err.value.reason, err.value.code)
    if err.value.reason == "missing":
        assert err.value.code == E.MISSING_REQUIRED_PARAMETER
    elif code not in (None, "unknown_parameter"):  # our own validators: the value is wrong
        assert err.value.code == E.INVALID_VALUE


_CHOICES = ("auto", "none", "required")
_named = st.builds(lambda n: {"type": "function", "function": {"name": n}}, st.text(max_size=70))
_hostile = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12),
                     st.sampled_from(_CHOICES), _named,
                     st.dictionaries(st.sampled_from(["type", "function", "name", "x"]),
                                     st.one_of(st.text(max_size=12), _named, st.dictionaries(
                                         st.sampled_from(["name", "arguments"]), st.text(max_size=12))), max_size=3),
                     st.lists(st.sampled_from(_CHOICES), max_size=2))


@settings(max_examples=300, deadline=None)
@given(_hostile, st.sampled_from([None, [], [WEATHER]]))
def test_any_tool_choice_is_served_as_openai_means_it_or_a_400_naming_it(choice, tools):
    fields = {"tool_choice": choice, **({} if tools is None else {"tools": tools})}
    names = [t["function"]["name"] for t in tools or []]
    forced = choice == "required" or (isinstance(choice, dict) and set(choice) == {"type", "function"}
                                      and choice["type"] == "function" and isinstance(choice["function"], dict)
                                      and set(choice["function"]) == {"name"})
    ok = choice is None or choice in ("auto", "none") or (forced and (choice == "required" or
                                                                      choice["function"]["name"] in names) and names)
    try:
        req = schemas.parse(schemas.ChatRequest, body(**fields))
    except ApiError as err:
        assert not ok and err.status == 400, choice
        assert err.param == "tool_choice" and err.message.startswith(("Invalid 'tool_choice': ",
                                                                       "Invalid type for 'tool_choice'"))
        return
    assert ok, choice
    up = req.upstream()
    assert "tool_choice" not in up and "tools" not in up
    if forced:                          # the model continues the opening of a call
        assert up["messages"][-1] == {"role": "assistant", "content": req.prefix()} and req.prefix()
        assert up["continue_final_message"] is True and up["add_generation_prompt"] is False
    else:
        assert up["messages"][-1] == ASK[-1] and "continue_final_message" not in up and req.prefix() == ""


def test_a_forced_call_is_prefilled_and_parsed_from_prefix_plus_continuation():
    named = {"type": "function", "function": {"name": "get_weather"}}
    req = schemas.parse(schemas.ChatRequest, body(tools=[WEATHER], tool_choice=named))
    assert req.served_messages()[:-1] == with_tools(ASK, [WEATHER]) and req.prefix() == call_prefix(named)
    assert tool_reply(req.prefix() + ' {"city": "Oslo"}}]</tool_call>', "u")["tool_calls"][0]["function"] == \
        {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}
    assert schemas.parse(schemas.ChatRequest, body(tools=[WEATHER], tool_choice="none")).prefix() == ""


def test_tools_are_rendered_into_the_served_prompt_not_forwarded():
    req = schemas.parse(schemas.ChatRequest, body(tools=[WEATHER]))
    up = req.upstream()
    assert "tools" not in up and "tool_choice" not in up
    assert up["messages"][0] == {"role": "system", "content": tools_system_prompt([WEATHER])}
    assert up["messages"][1:] == ASK
    none = schemas.parse(schemas.ChatRequest, body(tools=[WEATHER], tool_choice="none")).upstream()
    assert none["messages"] == ASK                       # "none": the model is not shown the tools


def test_a_reply_with_calls_maps_to_openai_tool_calls():
    reply = tool_reply('Let me check. <tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}},'
                       ' {"name": "get_weather", "arguments": {"city": "Rome"}}]</tool_call>', "u1-s")
    assert reply["content"] == "Let me check."
    assert [c["type"] for c in reply["tool_calls"]] == ["function", "function"]
    assert [json.loads(c["function"]["arguments"]) for c in reply["tool_calls"]] == [{"city": "Oslo"}, {"city": "Rome"}]
    assert [c["id"] for c in reply["tool_calls"]] == ["call_0_u1-s", "call_1_u1-s"]  # each names its turn
    bare = tool_reply('{"name": "get_weather", "arguments": {"city": "Oslo"}}', "u")
    assert bare["content"] is None and bare["tool_calls"][0]["function"]["name"] == "get_weather"
    assert tool_reply("It is sunny.", "u") is None
    assert tool_reply('<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>', "u") is None  # malformed
    assert tool_reply('<tool_call>[{"name": "a", "arguments": {}}, {"arguments": {}}]</tool_call>', "u") is None


def test_held_stream_chunks_carry_the_calls_whole():
    req = schemas.parse(schemas.ChatRequest, body(tools=[WEATHER], stream=True))
    turn = {"trace_id": "t", "turn_id": "u", "adapter_version": 1, "train": True}
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    no = {"logprobs": False, "token_ids": False}
    chunks = Gateway._held_chunks({"id": "x", "object": "chat.completion.chunk", "created": 1}, [text], ["stop"],
                                  [[]], [[1, 2]], None, [turn], req, no)
    echoed = chunks[0]["tracerl"]                 # the turn's ids (and whatever else the gateway echoes)
    assert echoed["turn_id"] == "u" and echoed["turn_ids"] == ["u"]
    assert {k: v for k, v in echoed.items() if k != "turn_ids"} == {k: turn[k] for k in echoed if k != "turn_ids"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chunks[0]["choices"][0]["turn_id"] == "u"
    call0 = chunks[1]["choices"][0]["delta"]["tool_calls"][0]
    assert call0["index"] == 0 and json.loads(call0["function"]["arguments"]) == {"city": "Oslo"}
    assert call0["id"].endswith("_u")             # the call names the turn (choice) that made it
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    plain = Gateway._held_chunks({}, ["Hi."], ["length"], [[]], [[]], None, [turn], req, no)
    assert plain[0]["choices"][0]["delta"]["content"] == "Hi." and plain[-1]["choices"][0]["finish_reason"] == "length"
    # n = 2: each choice's chunks carry its index, its turn id on its first chunk, its calls naming its turn
    two = Gateway._held_chunks({}, [text, "Hi."], ["stop", "length"], [[], []], [[], []], None,
                               [turn, dict(turn, turn_id="w")], req, no)
    assert "tracerl" in two[0] and all("tracerl" not in c for c in two[1:])
    assert two[0]["tracerl"]["turn_ids"] == ["u", "w"]
    by_index = {}
    for c in two:
        by_index.setdefault(c["choices"][0]["index"], []).append(c["choices"][0])
    assert [c["turn_id"] for c in (by_index[0][0], by_index[1][0])] == ["u", "w"]
    assert by_index[0][-1]["finish_reason"] == "tool_calls" and by_index[1][-1]["finish_reason"] == "length"
    assert by_index[1][0]["delta"]["content"] == "Hi."


# -- the served path: tiny vLLM, real Kafka -------------------------------------------------------

def _prompt_ids(boundary, messages: list[dict], continue_final: bool = False) -> list[int]:
    """The served model's own chat template over the recorded messages (``continue_final``: the last
    one is the prefilled start of the reply)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(boundary.root / "tiny")
    return list(tok.apply_chat_template(messages, add_generation_prompt=not continue_final,
                                        continue_final_message=continue_final, tokenize=True,
                                        return_dict=True)["input_ids"])


def _expect_mapping(choice: dict) -> None:
    """What the gateway must have answered, given the raw text it recorded (checked by the caller)."""
    msg = choice["message"]
    if msg.get("tool_calls"):
        assert choice["finish_reason"] == "tool_calls"
        for c in msg["tool_calls"]:
            assert c["type"] == "function" and isinstance(json.loads(c["function"]["arguments"]), dict)
    else:
        assert choice["finish_reason"] in ("stop", "length") and isinstance(msg["content"], str)


@pytest.mark.slow
def test_a_tools_request_is_served_in_openai_shape_and_recorded_as_served(boundary):
    status, out = call(f"{boundary.url}/v1/chat/completions", KEYS["acme"],
                       body(tools=[WEATHER], tool_choice="auto", return_token_ids=True, logprobs=True))
    assert status == 200, out
    assert out["object"] == "chat.completion" and out["model"] == "support"
    _expect_mapping(out["choices"][0])
    tid = out["tracerl"]["turn_id"]
    turn = kafka_events(boundary.cfg, {tid})[tid]
    assert turn["input_messages"][0] == {"role": "system", "content": tools_system_prompt([WEATHER])}
    assert turn["input_messages"][1:] == ASK
    # the record is what was served: raw text, tokens, and a prompt that re-renders to the same ids
    assert turn["output_token_ids"] == out["choices"][0]["token_ids"]
    assert turn["prompt_token_ids"] == out["prompt_token_ids"]
    assert _prompt_ids(boundary, turn["input_messages"]) == turn["prompt_token_ids"]
    expect = tool_reply(turn["output_text"], tid)
    msg = out["choices"][0]["message"]
    if expect is None:
        assert msg["content"] == turn["output_text"] and not msg.get("tool_calls")
    else:
        assert msg["content"] == expect["content"]
        assert [c["function"] for c in msg["tool_calls"]] == [c["function"] for c in expect["tool_calls"]]
    assert turn["finish_reason"] in ("stop", "length")       # the engine's own reason is recorded


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_is_served_as_a_continued_prefix_and_recorded_as_served(boundary, choice):
    status, out = call(f"{boundary.url}/v1/chat/completions", KEYS["acme"],
                       body(tools=[WEATHER], tool_choice=choice, return_token_ids=True, logprobs=True))
    assert status == 200, out
    tid = out["tracerl"]["turn_id"]
    turn = kafka_events(boundary.cfg, {tid})[tid]
    prefix = call_prefix(choice)
    # the prefix is the prompt's end: the last input message, and inside the recorded prompt ids
    assert turn["input_messages"] == [*with_tools(ASK, [WEATHER]), {"role": "assistant", "content": prefix}]
    assert turn["prompt_token_ids"] == out["prompt_token_ids"] == _prompt_ids(boundary, turn["input_messages"],
                                                                                continue_final=True)
    # the output is only what was sampled, with one behaviour logprob per token
    assert turn["output_token_ids"] == out["choices"][0]["token_ids"]
    assert len(turn["output_logprobs"]) == len(turn["output_token_ids"]) > 0
    assert not turn["output_text"].startswith(prefix)
    # the reply is parsed from prefix + continuation
    expect, msg = tool_reply(prefix + turn["output_text"], tid), out["choices"][0]["message"]
    if expect is None:
        assert msg["content"] == prefix + turn["output_text"] and not msg.get("tool_calls")
        assert out["choices"][0]["finish_reason"] in ("stop", "length")
    else:
        assert [c["function"] for c in msg["tool_calls"]] == [c["function"] for c in expect["tool_calls"]]
        assert out["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.slow
def test_multi_turn_with_tool_calls_and_a_tool_result_is_accepted_and_recorded(boundary):
    history = [*ASK,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp_c": 4, "sky": "rain"})}]
    client = GatewayClient(boundary.url, KEYS["acme"])  # the app SDK passes tools like any OpenAI param
    out = client.chat("support", history, tools=[WEATHER], tool_choice="auto", max_tokens=24, temperature=0.0,
                      return_token_ids=True)
    _expect_mapping(out["choices"][0])
    tid = out["tracerl"]["turn_id"]
    turn = kafka_events(boundary.cfg, {tid})[tid]
    roles = [m["role"] for m in turn["input_messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assert turn["input_messages"][0]["content"] == tools_system_prompt([WEATHER])
    said = parse_tool_calls(turn["input_messages"][2]["content"])
    assert [(c.name, c.arguments) for c in said.calls] == [("get_weather", {"city": "Oslo"})]
    assert turn["input_messages"][3] == {"role": "tool", "content": history[2]["content"], "tool_call_id": "call_1"}
    assert _prompt_ids(boundary, turn["input_messages"]) == out["prompt_token_ids"] == turn["prompt_token_ids"]


@pytest.mark.slow
def test_invalid_tools_are_a_400_over_http_and_stream_with_tools_is_openai_chunks(boundary):
    bad = body(tools=[{"type": "function", "function": {"name": "x", "parameters": {"type": "array"}}}])
    status, err = call(f"{boundary.url}/v1/chat/completions", KEYS["acme"], bad)
    assert status == 400 and is_openai_error(err) and err["error"]["param"] == "tools[0].function.parameters"
    status, err = call(f"{boundary.url}/v1/chat/completions", KEYS["acme"], body(tool_choice="required"))
    assert status == 400 and err["error"]["param"] == "tool_choice" and "sends no tools" in err["error"]["message"]

    import urllib.request
    req = urllib.request.Request(f"{boundary.url}/v1/chat/completions", method="POST",
                                 data=json.dumps(body(tools=[WEATHER], stream=True)).encode(),
                                 headers={"Authorization": f"Bearer {KEYS['acme']}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        lines = [line for line in resp.read().decode().split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["tracerl"]["turn_id"] and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    tid = chunks[0]["tracerl"]["turn_id"]
    turn = kafka_events(boundary.cfg, {tid})[tid]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    expect = tool_reply(turn["output_text"], tid)
    assert streamed == (turn["output_text"] if expect is None else expect["content"] or "")
    assert turn["input_messages"][0]["content"] == tools_system_prompt([WEATHER])


@pytest.mark.slow
def test_tool_messages_answering_its_calls_are_recorded_as_the_calling_turns_tool_outcomes(boundary):
    """The app runs the calls and sends the results back as ``tool`` messages: each answer to one of
    the gateway's calls becomes the calling turn's tool_call event, judged by what the request
    carries; a forged call id records nothing."""
    client = GatewayClient(boundary.url, KEYS["acme"])
    first = client.chat("support", ASK, tools=[WEATHER], max_tokens=8, temperature=0.0)
    trace, turn_id = first["tracerl"]["trace_id"], first["tracerl"]["turn_id"]
    forged = "call_0_" + turn_id.rpartition("-")[0] + "-0000000000000000"   # a turn id with a wrong signature
    calls = [("call_0_" + turn_id, {"city": "Oslo"}), ("call_1_" + turn_id, {"town": "Oslo"}),
             ("call_2_" + turn_id, {"city": "Atlantis"}), (forged, {"city": "Rome"})]
    results = [json.dumps({"temp_c": 4}), json.dumps({"temp_c": 4}), json.dumps({"error": "unknown city"}),
               json.dumps({"temp_c": 20})]
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(a)}}
        for cid, a in calls]}, *({"role": "tool", "tool_call_id": cid, "content": r}
                                 for (cid, _), r in zip(calls, results))]
    for _ in range(2):   # apps resend the history: both sends carry the same event ids
        out = client.chat("support", history, tools=[WEATHER], max_tokens=8, temperature=0.0,
                          tracerl={"trace_id": trace})
        assert out["tracerl"]["trace_id"] == trace
    ids = {f"result-{cid}" for cid, _ in calls}
    events = kafka_events(boundary.cfg, ids)
    assert set(events) == ids - {f"result-{forged}"}            # the forged id recorded nothing
    got = {e["call_id"]: (e["turn_id"], e["outcome"], e["trace_id"], e["name"]) for e in events.values()}
    assert got == {calls[0][0]: (turn_id, "ok", trace, "get_weather"),
                   calls[1][0]: (turn_id, "invalid_arguments", trace, "get_weather"),
                   calls[2][0]: (turn_id, "error", trace, "get_weather")}
    assert events[f"result-{calls[2][0]}"]["error"] == "unknown city"
    assert events[f"result-{calls[0][0]}"]["arguments"] == {"city": "Oslo"}
