"""OpenAI conformance through the official `openai` SDK against the shared `boundary` gateway (tiny
vLLM, real Kafka), issue #43 point 3:

- errors carry OpenAI's ``type`` / ``code`` / ``param`` (``invalid_type``, ``unknown_parameter``,
  ``missing_required_parameter``, ``model_not_found``, ``invalid_api_key``, ...), so the SDK's
  ``err.code`` / ``err.param`` / ``err.type`` read as they do against api.openai.com;
- the adapter version is one int everywhere the gateway shows it (``/v1/models`` and the reply);
- ``n > 1`` is served, streamed or not: n choices, each recorded as its own ModelTurn (own turn
  id, own tokens and behaviour logprobs; same trace, turn index and input, so the learner, which
  groups turns by their input messages, puts the n samples in one group), each one's turn id
  returned (``choices[i].turn_id``, ``tracerl.turn_ids``) and accepted by feedback.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from pipelines.deploy import schemas
from pipelines.deploy.errors import CODES, OPENAI_CODES
from tests.deploy.conftest import KEYS
from tests.deploy.test_gateway import kafka_events

pytestmark = pytest.mark.slow
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(boundary) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{boundary.url}/v1", api_key=KEYS["acme"], max_retries=0, timeout=120)


def _feedback(client: openai.OpenAI, trace_id: str, turn_id: str, value: int) -> dict:
    return client.post("/feedback", cast_to=object, body={"trace_id": trace_id, "turn_id": turn_id, "kind": "thumbs",
                                                         "value": value, "app": "sdk-openai-test"})


# -- n > 1 ----------------------------------------------------------------------------------------

def test_n_choices_are_n_recorded_turns_of_one_group_each_with_its_own_id(boundary, client):
    r = client.chat.completions.create(model="support", messages=HELLO, max_tokens=6, temperature=1.0, n=3,
                                       logprobs=True, extra_body={"return_token_ids": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    ext = r.model_extra["tracerl"]
    ids = [c.model_extra["turn_id"] for c in r.choices]
    assert len(set(ids)) == 3 and ext["turn_ids"] == ids and ext["turn_id"] == ids[0]

    turns = kafka_events(boundary.cfg, set(ids))
    assert set(turns) == set(ids)
    recorded = [turns[i] for i in ids]
    # one turn of the conversation, sampled three times: one trace, one index, one input (one group)
    assert {t["trace_id"] for t in recorded} == {ext["trace_id"]}
    assert {t["turn_index"] for t in recorded} == {0}
    assert all(t["input_messages"] == recorded[0]["input_messages"] for t in recorded)
    assert all(t["adapter_version"] == ext["adapter_version"] == 1 for t in recorded)
    # each choice's own behaviour: its text, token ids and logprobs, as the reply gave them
    for choice, t in zip(r.choices, recorded):
        assert t["output_text"] == (choice.message.content or "")
        assert t["output_token_ids"] == choice.model_extra["token_ids"] and t["output_token_ids"]
        assert t["output_logprobs"] == [lp.logprob for lp in choice.logprobs.content]
        assert t["finish_reason"] == choice.finish_reason

    # feedback names each choice's turn
    for i, turn_id in enumerate(ids):
        got = _feedback(client, ext["trace_id"], turn_id, 1 if i == 0 else -1)
        assert got["trace_id"] == ext["trace_id"] and got["event_id"]

    # the request was one turn of the conversation: the next one is turn 1, not turn 3
    nxt = client.chat.completions.create(model="support", messages=HELLO, max_tokens=2,
                                         extra_body={"tracerl": {"trace_id": ext["trace_id"]}})
    nid = nxt.model_extra["tracerl"]["turn_id"]
    assert kafka_events(boundary.cfg, {nid})[nid]["turn_index"] == 1


def test_n_streamed_gives_each_choice_its_chunks_its_turn_id_and_its_recorded_turn(boundary, client):
    chunks = list(client.chat.completions.create(model="support", messages=HELLO, max_tokens=6, temperature=1.0,
                                                 n=2, stream=True))
    ext = next(c.model_extra["tracerl"] for c in chunks if "tracerl" in (c.model_extra or {}))
    assert "tracerl" in (chunks[0].model_extra or {}) and len(ext["turn_ids"]) == 2
    text: dict[int, str] = {}
    named: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + (c.delta.content or "")
            if "turn_id" in (c.model_extra or {}):
                assert c.index not in named  # on the choice's first chunk only
                named[c.index] = c.model_extra["turn_id"]
            finish[c.index] = c.finish_reason or finish.get(c.index)
    assert sorted(text) == [0, 1] and [named[0], named[1]] == ext["turn_ids"]
    assert all(finish[i] in ("stop", "length") for i in (0, 1))
    turns = kafka_events(boundary.cfg, set(ext["turn_ids"]))
    for i, turn_id in enumerate(ext["turn_ids"]):
        assert turns[turn_id]["output_text"] == text[i] and turns[turn_id]["output_token_ids"]
        assert len(turns[turn_id]["output_logprobs"]) == len(turns[turn_id]["output_token_ids"])
    assert turns[ext["turn_ids"][0]]["trace_id"] == turns[ext["turn_ids"][1]]["trace_id"] == ext["trace_id"]
    assert _feedback(client, ext["trace_id"], ext["turn_ids"][1], 1)["event_id"]


def test_n_above_the_bound_is_openai_s_integer_above_max_value_naming_n(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="support", messages=HELLO, max_tokens=2, n=schemas.MAX_N + 1)
    assert (e.value.code, e.value.param, e.value.type) == ("integer_above_max_value", "n", "invalid_request_error")
    assert f"<= {schemas.MAX_N}" in e.value.body["message"]


# -- errors ---------------------------------------------------------------------------------------

def test_error_bodies_carry_openai_s_type_code_and_param(boundary, client):
    def refused(exc, call) -> openai.APIStatusError:
        with pytest.raises(exc) as e:
            call()
        body = e.value.body
        assert set(body) >= {"message", "type", "param", "code"} and body["code"] in CODES, body
        assert (e.value.code, e.value.param, e.value.type) == (body["code"], body["param"], body["type"])
        return e.value

    chat = client.chat.completions.create
    err = refused(openai.BadRequestError, lambda: chat(model="support", messages=HELLO, max_tokens=2,
                                                       extra_body={"temperature": "hot"}))
    assert (err.code, err.param, err.type) == ("invalid_type", "temperature", "invalid_request_error")
    assert err.body["message"] == "Invalid type for 'temperature': expected a decimal, but got a string instead."

    err = refused(openai.BadRequestError, lambda: chat(model="support", messages=HELLO, max_tokens=2,
                                                       extra_body={"logit_bias": {"1": 5}}))
    assert (err.code, err.param) == ("unknown_parameter", "logit_bias")

    err = refused(openai.BadRequestError, lambda: client.post("/chat/completions", cast_to=object,
                                                              body={"model": "support"}))
    assert (err.code, err.param) == ("missing_required_parameter", "messages")

    err = refused(openai.BadRequestError, lambda: chat(model="support", messages=[{"role": "wizard", "content": "x"}],
                                                       max_tokens=2))
    assert (err.code, err.param) == ("invalid_value", "messages[0].role")

    err = refused(openai.NotFoundError, lambda: chat(model="no-such-task", messages=HELLO, max_tokens=2))
    assert (err.code, err.param, err.type) == ("model_not_found", "model", "invalid_request_error")

    bad_key = openai.OpenAI(base_url=f"{boundary.url}/v1", api_key="not-a-key", max_retries=0)
    err = refused(openai.AuthenticationError, lambda: bad_key.chat.completions.create(
        model="support", messages=HELLO, max_tokens=2))
    assert (err.code, err.type, err.param) == ("invalid_api_key", "invalid_request_error", None)

    err = refused(openai.NotFoundError, lambda: client.get("/no/such/route", cast_to=object))
    assert err.code == "unknown_url"

    # feedback naming a turn that is not this trace's: a 404 in the same vocabulary
    r = chat(model="support", messages=HELLO, max_tokens=2)
    other = chat(model="support", messages=HELLO, max_tokens=2).model_extra["tracerl"]
    err = refused(openai.NotFoundError, lambda: _feedback(client, r.model_extra["tracerl"]["trace_id"],
                                                          other["turn_id"], 1))
    assert (err.code, err.param) == ("not_found", "turn_id")


def test_a_prompt_over_the_model_s_context_is_context_length_exceeded(client):
    """vLLM's own 400 (``type: BadRequestError, code: 400``) reaches the client in OpenAI's terms."""
    long = " ".join(f"word{i}" for i in range(3000))  # the tiny model's context is 1024 tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="support", messages=[{"role": "user", "content": long}], max_tokens=2)
    assert (e.value.code, e.value.param, e.value.type) == ("context_length_exceeded", "messages",
                                                           "invalid_request_error")
    assert "maximum context length" in e.value.body["message"]


def test_every_4xx_of_a_raw_client_is_openai_shaped_with_a_string_code(boundary):
    """Plain httpx, bodies the SDK would not send: each refusal's code is a string of the vocabulary."""
    url, auth = f"{boundary.url}/v1/chat/completions", {"Authorization": f"Bearer {KEYS['acme']}"}
    cases = [(b"{not json", "invalid_json"), (b"[1]", "invalid_type"),
             (b'{"model": "support", "messages": [{"role": "user", "content": "x"}], "seed": 1e999}', "invalid_value"),
             (b'{"model": "support", "messages": [{"role": "user", "content": "x"}], "n": 2, "top_k": "5"}',
              "invalid_type")]
    for raw, code in cases:
        resp = httpx.post(url, content=raw, headers={**auth, "Content-Type": "application/json"}, timeout=30)
        err = resp.json()["error"]
        assert resp.status_code == 400 and err["code"] == code and err["type"] == "invalid_request_error", (raw, err)
    assert "invalid_json" in CODES and "invalid_json" not in OPENAI_CODES  # ours: OpenAI answers null there


# -- one version representation -------------------------------------------------------------------

def test_models_and_replies_show_the_adapter_version_as_the_same_int(client):
    m = client.models.list().data[0]
    reply = client.chat.completions.create(model=m.id, messages=HELLO, max_tokens=2)
    version = m.model_extra["version"]
    assert isinstance(version, int) and not isinstance(version, bool)
    retrieved = client.models.retrieve(m.id).model_extra["version"]
    assert version == reply.model_extra["tracerl"]["adapter_version"] == retrieved
