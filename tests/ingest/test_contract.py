"""The trace contract: shipped JSON Schema, validator, and their agreement."""

import json

import jsonschema
import pytest

from pipelines.contract import jsonschema as contract_schema
from pipelines.contract.events import EVENT_TYPES, Feedback, ModelTurn
from pipelines.contract.validate import ValidationError, decode_message, validate_event
from pipelines.ingest.sample import bad_messages, generate


def test_shipped_schema_file_is_current():
    shipped = contract_schema.SCHEMA_PATH.read_text()
    assert shipped == contract_schema.render(), "run `tracerl schema --write` after changing events.py"


def test_sample_events_of_every_type_pass_validator_and_json_schema():
    schema = json.loads(contract_schema.SCHEMA_PATH.read_text())
    events = [e.to_dict() for e in generate(40, seed=3)]
    assert {e["type"] for e in events} == set(EVENT_TYPES)
    for e in events:
        validate_event(e)
        jsonschema.validate(e, schema)


@pytest.mark.parametrize("reason,raw", bad_messages(4096), ids=lambda x: x if isinstance(x, str) else "")
def test_every_bad_class_is_rejected_with_its_reason(reason, raw):
    with pytest.raises(ValidationError) as err:
        decode_message(raw, max_bytes=4096)
    assert err.value.reason == reason


def test_json_schema_rejects_what_the_validator_rejects():
    schema = json.loads(contract_schema.SCHEMA_PATH.read_text())
    for reason, raw in bad_messages(10**7):
        if reason in ("not_json", "oversize", "invalid_value"):
            continue  # not expressible in JSON Schema (bytes, size, RFC 3339 parsing)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(raw), schema)


def test_unknown_optional_field_from_newer_producer_is_kept():
    e = generate(1, seed=1)[0].to_dict() | {"client_region": "eu-west-1"}
    assert validate_event(e)["client_region"] == "eu-west-1"


@pytest.mark.parametrize("change,reason,needle", [
    ({"output_logprobs": [-0.1]}, "invalid_value", "one logprob per sampled token"),
    ({"tenant": "acme/../../etc"}, "invalid_value", "tenant"),
    ({"event_time": "2026-11-30T10:00:00"}, "invalid_value", "timezone"),
    ({"output_token_ids": [1, "2"]}, "wrong_type", "output_token_ids"),
    ({"input_messages": [{"role": "robot", "content": "x"}]}, "invalid_value", "input_messages[0].role"),
    ({"adapter_version": "v3"}, "wrong_type", "adapter_version must be an integer, got str 'v3'"),
    ({"adapter_version": 0}, "invalid_value", "adapter_version must be at least 1 (null is the base model)"),
])
def test_turn_errors_name_what_is_wrong(change, reason, needle):
    turn = next(e for e in generate(5, seed=2) if isinstance(e, ModelTurn)).to_dict()
    turn.update(output_token_ids=[1, 2, 3], output_logprobs=[-0.1, -0.2, -0.3])
    turn.update(change)
    with pytest.raises(ValidationError) as err:
        validate_event(turn)
    assert err.value.reason == reason and needle in str(err.value)


@pytest.mark.parametrize("fields,ok", [
    ({"kind": "thumbs", "value": 1}, True),
    ({"kind": "thumbs", "value": 0}, False),
    ({"kind": "thumbs"}, False),
    ({"kind": "rating", "value": 4}, True),
    ({"kind": "rating", "value": 9}, False),
    ({"kind": "rating", "value": 9, "scale_min": 0, "scale_max": 10}, True),
    ({"kind": "edit"}, False),
    ({"kind": "follow_up", "text": "wrong!", "sentiment": "dissatisfied"}, True),
    ({"kind": "regenerate"}, True),
])
def test_feedback_kind_rules(fields, ok):
    e = Feedback(tenant="acme", app="a", trace_id="t", turn_id="u", **fields).to_dict()
    if ok:
        validate_event(e)
    else:
        with pytest.raises(ValidationError):
            validate_event(e)
