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
        assert err.status == 400 and err.message
    else:
        assert _encodable(value)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_text_parses_to_strict_json_or_is_a_400(value):
    text = json.dumps(value)  # NaN, Infinity, lone surrogates, huge ints: all writable by json.dumps
    try:
        parsed = parse_json(text.encode("utf-8", "surrogatepass"), DEPTH)
    except ApiError as err:
        assert err.status == 400 and err.message
    else:
        assert _encodable(parsed)


@pytest.mark.parametrize("raw, code", [
    (b"[" * 100_000 + b"]" * 100_000, "too_deep"),
    (b"[" * (DEPTH + 2) + b"]" * (DEPTH + 2), "too_deep"),
    (b'{"a": NaN}', "non_finite_number"),
    (b'{"a": -Infinity}', "non_finite_number"),
    (b'{"a": 1e999}', "non_finite_number"),
    (b'{"a": "\\udc00"}', "invalid_unicode"),
    (b'{"\\ud800": 1}', "invalid_unicode"),
    (b'{"a": "\xed\xa0\x80"}', "invalid_encoding"),
    ('{"a": 1}'.encode("utf-16"), "invalid_encoding"),
    (b'{"a": ' + b"1" * 5000 + b"}", "invalid_json"),
    (b'{"a": 18446744073709551616}', "integer_out_of_range"),
])
def test_each_class_of_poison_is_named(raw, code):
    with pytest.raises(ApiError) as err:
        parse_json(raw, DEPTH)
    assert err.value.status == 400 and err.value.code == code


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(schemas.ChatRequest.model_fields)) | st.text(max_size=8),
                       json_values, max_size=6))
def test_chat_schema_refuses_with_a_named_field_or_accepts_what_a_turn_can_record(fields):
    body = {"model": "support", "messages": [{"role": "user", "content": "hi"}], **fields}
    try:
        req = schemas.parse(schemas.ChatRequest, body)
    except ApiError as err:  # the field it names is one the client sent
        assert err.status == 400 and err.param is not None
        assert any(err.param == k or err.param.startswith((f"{k}.", f"{k}[")) for k in body), err.param
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
        assert err.status == 400
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
