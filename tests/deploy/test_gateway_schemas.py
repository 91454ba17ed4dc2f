"""Property tests of the door itself, no server: the strict JSON parser and the request schemas
refuse with ApiError (a 4xx naming the field) and nothing else, and what they accept is what the
contract and JSON can carry on."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.contract.events import EVENT_TYPES
from pipelines.contract.validate import ValidationError, validate_event
from pipelines.deploy import schemas
from pipelines.deploy import errors as E
from pipelines.deploy.errors import ApiError
from pipelines.deploy.json_body import parse_json

DEPTH = 32
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30)


def _encodable(value) -> bool:
    """Strict JSON, UTF-8: what the emitter and ingest can write and read back."""
    json.dumps(value, allow_nan=False).encode("utf-8")
    return True


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_parse_or_are_a_400(raw):
    try:
        value = parse_json(raw, DEPTH)
    except ApiError as err:
        assert err.status == 400 and err.message and err.code in E.CODES
    else:
        assert _encodable(value)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_text_parses_to_strict_json_or_is_a_400(value):
    text = json.dumps(value)  # NaN, Infinity, lone surrogates, huge ints: all writable by json.dumps
    try:
        parsed = parse_json(text.encode("utf-8", "surrogatepass"), DEPTH)
    except ApiError as err:
        assert err.status == 400 and err.message and err.code in E.CODES
    else:
        assert _encodable(parsed)


@pytest.mark.parametrize("raw, reason, code", [
    (b"[" * 100_000 + b"]" * 100_000, "too_deep", "invalid_json"),
    (b"[" * (DEPTH + 2) + b"]" * (DEPTH + 2), "too_deep", "invalid_value"),
    (b'{"a": NaN}', "non_finite_number", "invalid_json"),
    (b'{"a": -Infinity}', "non_finite_number", "invalid_json"),
    (b'{"a": 1e999}', "non_finite_number", "invalid_value"),
    (b'{"a": "\\udc00"}', "invalid_unicode", "invalid_value"),
    (b'{"\\ud800": 1}', "invalid_unicode", "invalid_value"),
    (b'{"a": "\xed\xa0\x80"}', "invalid_encoding", "invalid_json"),
    ('{"a": 1}'.encode("utf-16"), "invalid_encoding", "invalid_json"),
    (b'{"a": ' + b"1" * 5000 + b"}", "invalid_json", "invalid_json"),
    (b'{"a": 18446744073709551616}', "integer_out_of_range", "integer_above_max_value"),
    (b'{"a": -18446744073709551616}', "integer_out_of_range", "integer_below_min_value"),
])
def test_each_class_of_poison_is_named(raw, reason, code):
    """The finer cause is the error's reason; its code is OpenAI's where the value has a path, else
    the gateway's ``invalid_json`` (OpenAI answers code null for a body it cannot parse)."""
    with pytest.raises(ApiError) as err:
        parse_json(raw, DEPTH)
    assert err.value.status == 400 and err.value.reason == reason and err.value.code == code
    assert err.value.body()["error"]["code"] == code and err.value.body()["error"]["type"] == "invalid_request_error"


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(schemas.ChatRequest.model_fields)) | st.text(max_size=8),
                       json_values, max_size=6))
def test_chat_schema_refuses_with_a_named_field_or_accepts_what_a_turn_can_record(fields):
    body = {"model": "support", "messages": [{"role": "user", "content": "hi"}], **fields}
    try:
        req = schemas.parse(schemas.ChatRequest, body)
    except ApiError as err:  # the field it names is one the client sent, the code one of OpenAI's
        assert err.status == 400 and err.param is not None
        assert any(err.param == k or err.param.startswith((f"{k}.", f"{k}[")) for k in body), err.param
        assert err.code in E.OPENAI_CODES, (err.code, err.reason, err.message)
        return
    sampling = req.upstream()
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        assert name not in sampling or math.isfinite(sampling[name])
    for name in ("top_k", "max_tokens", "max_completion_tokens", "seed", "top_logprobs"):
        assert name not in sampling or type(sampling[name]) is int


def _feedback_fields():
    kinds = sorted(schemas.FEEDBACK_BODIES)
    names = sorted({n for m in schemas.FEEDBACK_BODIES.values() for n in m.model_fields})
    return st.builds(lambda kind, fields: {"trace_id": "t-1", **fields, "type": kind},
                     st.sampled_from(kinds), st.dictionaries(st.sampled_from(names), json_values, max_size=6))


@settings(max_examples=300, deadline=None)
@given(_feedback_fields())
def test_feedback_schema_then_contract_is_total(body):
    """Schema, then the contract event: a named 400 or an event the contract accepts."""
    model = schemas.FEEDBACK_BODIES[body["type"]]
    try:
        fields = schemas.parse(model, body).model_dump(exclude_none=True, exclude={"type", "tenant"})
    except ApiError as err:
        assert err.status == 400 and err.code in E.OPENAI_CODES, (err.code, err.reason)
        return
    fields.setdefault("app", "gw")
    event = EVENT_TYPES[body["type"]](tenant="acme", **fields).to_dict()
    try:
        validate_event(event)
    except ValidationError:
        return  # the gateway answers this 400 too (see test_gateway_hostile)
    assert _encodable(event)


def test_feedback_bodies_are_the_contract_minus_tenant():
    for kind, model in schemas.FEEDBACK_BODIES.items():
        contract = {f for f in EVENT_TYPES[kind].__dataclass_fields__}
        assert set(model.model_fields) == contract | {"type"}, kind
        assert not model.model_fields["tenant"].is_required()


def test_openapi_document_loads_in_schemathesis_and_covers_every_route():
    import schemathesis

    doc = schemas.openapi()
    ops = [r.ok() for r in schemathesis.openapi.from_dict(doc).get_all_operations()]
    assert {(o.method.upper(), o.path) for o in ops} == {
        ("POST", "/v1/chat/completions"), ("POST", "/v1/feedback"), ("GET", "/v1/models"), ("GET", "/v1/models/{model}"),
        ("POST", "/admin/deploy"), ("POST", "/admin/rollback"), ("POST", "/internal/swap"), ("GET", "/admin/swaps"),
        ("GET", "/admin/stats"), ("GET", "/health"), ("GET", "/openapi.json"),
        ("POST", "/admin/canary"), ("GET", "/admin/canary"), ("POST", "/admin/canary/share"),
        ("POST", "/admin/canary/stop")}
    assert doc["components"]["schemas"]["ChatRequest"]["additionalProperties"] is False


# -- OpenAI's error vocabulary (errors.py): what the SDK's users read in ``error.code`` --------------

CHAT = {"model": "support", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("fields, param, code", [
    ({"temperature": "hot"}, "temperature", "invalid_type"),
    ({"max_tokens": "2"}, "max_tokens", "invalid_type"),
    ({"top_k": 5.0}, "top_k", "invalid_type"),
    ({"stream": "yes"}, "stream", "invalid_type"),
    ({"model": None}, "model", "invalid_type"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "invalid_value"),
    ({"logit_bias": {"1": 100}}, "logit_bias", "unknown_parameter"),
    ({"tracerl": {"tenant": "globex"}}, "tracerl.tenant", "unknown_parameter"),
    ({"messages": None}, "messages", "invalid_type"),
    ({"messages": []}, "messages", "empty_array"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
    ({"temperature": 2.5}, "temperature", "decimal_above_max_value"),
    ({"temperature": -1}, "temperature", "decimal_below_min_value"),
    ({"top_p": 0}, "top_p", "decimal_below_min_value"),
    ({"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
    ({"n": schemas.MAX_N + 1}, "n", "integer_above_max_value"),
    ({"n": 0}, "n", "integer_below_min_value"),
    ({"model": "m" * 200}, "model", "string_above_max_length"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
])
def test_refusals_carry_openai_s_code_and_the_field_as_param(fields, param, code):
    with pytest.raises(ApiError) as err:
        schemas.parse(schemas.ChatRequest, {**CHAT, **fields})
    body = err.value.body()["error"]
    assert (err.value.status, body["type"], body["param"], body["code"]) == (400, "invalid_request_error", param, code)
    assert f"'{param}'" in body["message"]


def test_a_missing_field_and_a_wrong_type_are_worded_as_openai_words_them():
    with pytest.raises(ApiError) as err:
        schemas.parse(schemas.ChatRequest, {"model": "support"})
    assert err.value.message == "Missing required parameter: 'messages'."
    with pytest.raises(ApiError) as err:
        schemas.parse(schemas.ChatRequest, {**CHAT, "temperature": "hot"})
    assert err.value.message == "Invalid type for 'temperature': expected a decimal, but got a string instead."
    with pytest.raises(ApiError) as err:
        schemas.parse(schemas.ChatRequest, {**CHAT, "n": 17})
    assert err.value.message == "Invalid 'n': integer above maximum value. Expected a value <= 16, but got 17 instead."
    with pytest.raises(ApiError) as err:
        schemas.parse(schemas.ChatRequest, {**CHAT, "frobnicate": 1})
    assert err.value.message == "Unknown parameter: 'frobnicate'."


def test_n_up_to_its_bound_is_accepted_and_forwarded():
    for n in (1, 2, schemas.MAX_N):
        assert schemas.parse(schemas.ChatRequest, {**CHAT, "n": n}).upstream()["n"] == n


def test_every_code_has_one_type_and_status_codes_are_strings():
    assert E.OPENAI_CODES.isdisjoint(E.GATEWAY_CODES) and all(isinstance(c, str) for c in E.CODES)
    for status in (400, 401, 403, 404, 405, 409, 413, 422, 429, 500, 502, 503, 418, 504):
        body = E.error_body(status, "x")["error"]
        assert isinstance(body["code"], str) and body["code"] in E.CODES, status
        assert body["type"] == ("server_error" if status >= 500 else "requests" if status == 429
                                else "invalid_request_error")
    assert E.error_body(400, "x", code="made_up")["error"]["code"] == "invalid_value"  # never a non-code
    assert E.upstream_code(400, "This model's maximum context length is 2048 tokens. However, ...") == \
        "context_length_exceeded"
    assert schemas.openapi()["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"][
        "enum"] == sorted(E.CODES)
