"""Tools <-> hermes text: the prompt the model reads, the calls parsed back out of its reply."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.contract.tool_calls import (
    CALL_OPEN, call_prefix, check_call, parse_tool_calls, render_assistant_tool_calls, tools_system_prompt,
    with_tools,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"], "additionalProperties": False}}}
SMS = {"name": "send_sms", "parameters": {"type": "object", "properties": {"to": {"type": "string"}}}}


def test_prompt_lists_the_functions_as_json_inside_tools_tags():
    p = tools_system_prompt([WEATHER, SMS])
    listed = json.loads(p.split("<tools>")[1].split("</tools>")[0])
    assert listed == [WEATHER["function"], SMS]          # unwrapped, in the order given
    assert "<tool_call>[" in p and p == tools_system_prompt([WEATHER, SMS])


def test_with_tools_prepends_or_appends_and_copies():
    msgs = [{"role": "user", "content": "hi"}]
    out = with_tools(msgs, [WEATHER])
    assert [m["role"] for m in out] == ["system", "user"] and out[0]["content"] == tools_system_prompt([WEATHER])
    sys_msgs = [{"role": "system", "content": "Be brief."}, *msgs]
    out = with_tools(sys_msgs, [WEATHER])
    assert len(out) == 2 and out[0]["content"] == "Be brief.\n\n" + tools_system_prompt([WEATHER])
    assert sys_msgs[0]["content"] == "Be brief."        # the caller's messages are not modified
    assert with_tools(msgs, None) == msgs and with_tools(msgs, []) == msgs


def test_parse_list_object_bare_and_openai_string_arguments():
    p = parse_tool_calls('Checking. <tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}},'
                         ' {"name": "send_sms", "arguments": "{\\"to\\": \\"+1\\"}"}]</tool_call>')
    assert p.attempted and p.content == "Checking."
    assert [(c.name, c.arguments, c.error) for c in p.calls] == [
        ("get_weather", {"city": "Oslo"}, None), ("send_sms", {"to": "+1"}, None)]
    p = parse_tool_calls('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    assert p.content == "" and p.calls[0].arguments == {"city": "Rome"}
    p = parse_tool_calls(' {"name": "send_sms", "arguments": {"to": "x"}} ')
    assert p.attempted and p.calls[0].name == "send_sms"
    plain = parse_tool_calls("Just a reply, no tools.")
    assert not plain.attempted and plain.calls == () and plain.content == "Just a reply, no tools."
    assert not parse_tool_calls('{"name": "only a name"}').attempted


def test_malformed_calls_are_calls_with_reasons():
    errs = [c.error for c in parse_tool_calls(
        '<tool_call>{"name": "a", "arguments": {</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": [1]}</tool_call>'
        '<tool_call>{"name": "c", "arguments": "not json"}</tool_call>'
        '<tool_call>{"name": "d", "arguments": {}').calls]   # unclosed: the model stopped mid-call
    assert errs[0].startswith("invalid JSON") and errs[1] == "missing name"
    assert errs[2] == "arguments must be an object" and errs[3].startswith("arguments must be an object")
    assert errs[4].startswith("invalid JSON")


def test_check_call_against_the_schema():
    ok, = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}</tool_call>').calls
    assert check_call(ok, [WEATHER, SMS]) is None
    bad, = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": 3}}</tool_call>').calls
    assert "city" in check_call(bad, [WEATHER])
    missing, = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>').calls
    assert "required" in check_call(missing, [WEATHER])
    extra, = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": "a", "x": 1}}</tool_call>').calls
    assert check_call(extra, [WEATHER]) is not None
    unknown, = parse_tool_calls('<tool_call>{"name": "nope", "arguments": {}}</tool_call>').calls
    assert check_call(unknown, [WEATHER]) == "unknown tool 'nope'"
    broken, = parse_tool_calls("<tool_call>{oops</tool_call>").calls
    assert check_call(broken, [WEATHER]).startswith("invalid JSON")
    weird = {"name": "w", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}
    call, = parse_tool_calls('<tool_call>{"name": "w", "arguments": {"a": 1}}</tool_call>').calls
    assert isinstance(check_call(call, [weird]), str)     # a broken schema is a reason, not a crash


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet='<>/{}[]":,tool_call namerguts\\ 01'),
                 st.builds(lambda a, b: f"{a}{CALL_OPEN}{b}", st.text(), st.text())))
def test_parse_never_raises(text):
    p = parse_tool_calls(text)
    assert isinstance(p.content, str) and all(c.error is None or isinstance(c.error, str) for c in p.calls)
    assert p.attempted == (CALL_OPEN in text or bool(p.calls))
    for c in p.valid:
        assert isinstance(c.name, str) and isinstance(c.arguments, dict)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                     max_leaves=8)
_calls = st.lists(st.builds(lambda n, a, as_str: {"id": "c", "type": "function", "function": {
    "name": n, "arguments": json.dumps(a) if as_str else a}},
    st.from_regex(r"[a-zA-Z0-9_-]{1,64}", fullmatch=True),
    st.dictionaries(st.text(max_size=6), _json, max_size=4), st.booleans()), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40).filter(lambda s: "<tool_call>" not in s and "</tool_call>" not in s), _calls)
def test_render_then_parse_round_trips(content, calls):
    p = parse_tool_calls(render_assistant_tool_calls(content, calls))
    assert p.content == content.strip()
    want = [(c["function"]["name"], c["function"]["arguments"] if isinstance(c["function"]["arguments"], dict)
             else json.loads(c["function"]["arguments"])) for c in calls]
    assert [(c.name, c.arguments) for c in p.calls] == want and all(c.error is None for c in p.calls)


def test_a_forced_choice_prefills_the_opening_of_a_call():
    msgs = [{"role": "user", "content": "Weather in Oslo?"}]
    assert with_tools(msgs, [WEATHER], "auto") == with_tools(msgs, [WEATHER], None) == with_tools(msgs, [WEATHER])
    assert with_tools(msgs, None, "required") == msgs                # no tools: nothing to force
    out = with_tools(msgs, [WEATHER], "required")
    assert [m["role"] for m in out] == ["system", "user", "assistant"] and out[-1]["content"] == call_prefix("required")
    named = with_tools(msgs, [WEATHER, SMS], {"type": "function", "function": {"name": "send_sms"}})
    assert named[:2] == with_tools(msgs, [WEATHER, SMS]) and named[-1]["role"] == "assistant"
    for prefix in (call_prefix("required"), named[-1]["content"]):
        assert prefix.startswith(CALL_OPEN) and prefix == prefix.strip()   # templates strip a continued message
    # what the model writes after the prefix completes a call the parser reads back
    said = parse_tool_calls(call_prefix("required") + 'get_weather", "arguments": {"city": "Oslo"}}]</tool_call>')
    assert [(c.name, c.arguments, c.error) for c in said.calls] == [("get_weather", {"city": "Oslo"}, None)]
    said = parse_tool_calls(named[-1]["content"] + ' {"to": "+4712345678"}}]</tool_call>')
    assert [(c.name, c.arguments) for c in said.calls] == [("send_sms", {"to": "+4712345678"})]
    assert call_prefix("auto") == call_prefix("none") == call_prefix(None) == ""


@given(st.from_regex(r"[a-zA-Z0-9_-]{1,64}", fullmatch=True), st.dictionaries(st.text(max_size=6), _json, max_size=4))
def test_a_named_prefix_holds_the_name_and_round_trips(name, args):
    prefix = call_prefix({"type": "function", "function": {"name": name}})
    said = parse_tool_calls(prefix + " " + json.dumps(args) + "}]</tool_call>")
    assert [(c.name, c.arguments) for c in said.calls] == [(name, args)]
