"""The gateway as an app developer meets it: the official `openai` Python SDK, unmodified, pointed
at the gateway (`base_url=<gateway>/v1`, the tenant's key), on the shared `boundary` gateway (tiny
vLLM, real Kafka): plain and streaming chats, carrying a conversation's trace, tools, `n`, errors
as the SDK's typed exceptions, the model list, and feedback through the SDK's own `post` and one
plain `httpx` call (docs/api.md shows the same calls)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.deploy.conftest import KEYS

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(boundary) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{boundary.url}/v1", api_key=KEYS["acme"], max_retries=0, timeout=120)


def test_a_plain_chat_is_an_openai_completion_with_its_trace_and_turn(client):
    r = client.chat.completions.create(model="support", messages=HELLO, max_tokens=8, temperature=0.0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1
    ext = r.model_extra["tracerl"]
    assert ext["trace_id"] and ext["turn_id"] and ext["adapter_version"] == 1
    # nothing of vLLM's internals leaks through the SDK's object
    assert not {"prompt_logprobs", "kv_transfer_params", "prompt_token_ids"} & set(r.model_extra)


def test_the_next_turn_carries_the_trace_by_extra_body_or_header(client):
    first = client.chat.completions.create(model="support", messages=HELLO, max_tokens=4)
    trace = first.model_extra["tracerl"]["trace_id"]
    again = [*HELLO, {"role": "assistant", "content": first.choices[0].message.content or "hi"},
             {"role": "user", "content": "Once more."}]
    by_body = client.chat.completions.create(model="support", messages=again, max_tokens=4,
                                             extra_body={"tracerl": {"trace_id": trace, "turn_index": 1}})
    by_header = client.chat.completions.create(model="support", messages=again, max_tokens=4,
                                               extra_headers={"X-Tracerl-Trace-Id": trace})
    assert by_body.model_extra["tracerl"]["trace_id"] == by_header.model_extra["tracerl"]["trace_id"] == trace
    turns = {first.model_extra["tracerl"]["turn_id"], by_body.model_extra["tracerl"]["turn_id"],
             by_header.model_extra["tracerl"]["turn_id"]}
    assert len(turns) == 3  # each turn its own id, so feedback can name it


def test_streaming_yields_chunks_that_add_up_to_the_reply(client):
    chunks = list(client.chat.completions.create(model="support", messages=HELLO, max_tokens=8,
                                                 temperature=0.0, stream=True))
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    plain = client.chat.completions.create(model="support", messages=HELLO, max_tokens=8, temperature=0.0)
    assert text == plain.choices[0].message.content  # greedy: the same reply, streamed or not
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert any("tracerl" in (c.model_extra or {}) for c in chunks)


def test_tools_pass_through_and_a_forced_call_comes_back_as_a_call_or_its_text(client):
    r = client.chat.completions.create(
        model="support", messages=[{"role": "user", "content": "Weather in Oslo?"}], max_tokens=16,
        temperature=0.0, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = r.choices[0].message
    if msg.tool_calls:  # the tiny model wrote valid JSON arguments
        assert msg.tool_calls[0].function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    else:  # it botched them: the text, opened as the gateway forced it
        assert msg.content.startswith('<tool_call>[{"name": "get_weather", "arguments":')


def test_n_choices_each_carry_their_turn_and_n_above_the_bound_is_a_400_naming_n(client):
    r = client.chat.completions.create(model="support", messages=HELLO, max_tokens=4, n=2)
    assert len(r.choices) == 2 and r.model_extra["tracerl"]["turn_ids"] == [c.model_extra["turn_id"] for c in r.choices]
    with pytest.raises(openai.BadRequestError) as e:  # more in test_gateway_openai.py
        client.chat.completions.create(model="support", messages=HELLO, max_tokens=4, n=10_000)
    assert e.value.status_code == 400 and e.value.body["param"] == "n" and e.value.code == "integer_above_max_value"


def test_errors_are_the_sdk_s_typed_exceptions_with_openai_bodies(boundary, client):
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=f"{boundary.url}/v1", api_key="not-a-key", max_retries=0).models.list()
    assert e.value.status_code == 401 and e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-task", messages=HELLO, max_tokens=4)
    assert e.value.body["param"] == "model" and "no-such-task" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:
        client.get("/no/such/route", cast_to=object)
    assert e.value.body["message"] == "no route GET /v1/no/such/route" and e.value.body["type"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="support", messages=[{"role": "wizard", "content": "hi"}], max_tokens=4)
    assert e.value.body["param"].startswith("messages[0]")


def test_models_list_and_retrieve_show_only_the_caller_s_tenant(boundary, client):
    models = client.models.list().data
    assert [m.id for m in models] == ["support"]
    m = models[0]
    assert m.object == "model" and m.owned_by == "acme" and m.created > 1_700_000_000
    assert client.models.retrieve("support").id == "support" == client.models.retrieve("acme/support").id
    for name in ("globex/support", "nope"):  # another tenant's model does not exist for this key
        with pytest.raises(openai.NotFoundError) as e:
            client.models.retrieve(name)
        assert e.value.body["code"] == "model_not_found"


def test_feedback_through_the_sdk_and_through_httpx(boundary, client):
    r = client.chat.completions.create(model="support", messages=HELLO, max_tokens=4)
    ext = r.model_extra["tracerl"]
    got = client.post("/feedback", cast_to=object, body={
        "trace_id": ext["trace_id"], "turn_id": ext["turn_id"], "kind": "thumbs", "value": 1, "app": "sdk-test"})
    assert got["trace_id"] == ext["trace_id"] and got["event_id"]
    plain = httpx.post(f"{boundary.url}/v1/feedback", headers={"Authorization": f"Bearer {KEYS['acme']}"},
                       json={"type": "session_end", "trace_id": ext["trace_id"], "outcome": "completed",
                             "app": "sdk-test"}, timeout=30)
    assert plain.status_code == 202 and plain.json()["trace_id"] == ext["trace_id"]
    with pytest.raises(openai.NotFoundError):  # a turn of another trace: not this caller's
        client.post("/feedback", cast_to=object, body={"trace_id": "tr-unknown", "turn_id": ext["turn_id"],
                                                       "kind": "thumbs", "value": 1})
