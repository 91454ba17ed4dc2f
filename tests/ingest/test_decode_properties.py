"""Decode is a total function: property-based tests over arbitrary bytes, arbitrary JSON and
valid events mutated by hypothesis.

For every input: `decode_message` returns an event or raises `ValidationError` (never
`internal_error`); `decode_chunk` never raises and accounts for every message (in = landed +
quarantined); and whatever lands is readable by every lake view.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.config import load_config
from pipelines.contract.events import EVENT_TYPES
from pipelines.contract.validate import INTERNAL_ERROR, MAX_DEPTH, ValidationError, decode_message, validate_event
from pipelines.ingest import decode as decode_module
from pipelines.ingest.decode import Chunk, Decoder, decode_chunk
from pipelines.ingest.sample import generate
from tests.ingest.hostile import _nest, base, corpus, land_tables, query_views, strict_json, strict_row

MAX = 64 * 1024
NOW = 1_700_000_000_000
# Every event type, two tenants, and events with the optional fields sample traffic leaves out (a rating's scale).
VALID = [e.to_dict() for e in generate(12, seed=5)] + [
    base(kind, i) | {"tenant": "acme"} for i, kind in enumerate(["model_turn", "feedback", "tool_call", "session_end"])]
VALID[-3] |= {"scale_min": 0, "scale_max": 10, "value": 7}
VALID[-4] |= {"adapter_version": 3}  # sample traffic is served by the base model (null)
DUCK = duckdb.connect()
SETTINGS = settings(deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Any code point, lone surrogates included (hypothesis leaves them out unless told).
chars = st.characters(exclude_categories=())
specials = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 2**31, 2**63, -2**63 - 1,
                            10**30, 10**400, "\ud800", "\udfff", "\ufeff", "\x00", "", True, None])
leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(chars, max_size=12), specials)
json_values = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(chars, max_size=6), inner, max_size=4),
    max_leaves=16) | st.integers(MAX_DEPTH - 3, MAX_DEPTH + 40).map(_nest)


def check_decodes(value: bytes | None) -> dict | None:
    """The property of one message: an event, or a ValidationError with a reason that blames the input."""
    try:
        return decode_message(value, MAX)
    except ValidationError as err:
        assert err.reason != INTERNAL_ERROR, err
        return None


CODECS = ["ascii"] * 6 + ["utf-8"] * 3 + ["utf-8-sig", "utf-16", "utf-16-le", "utf-32"]
codecs = st.sampled_from(CODECS)


def encode(obj, codec: str) -> bytes:
    """JSON as a producer might send it: ASCII with escapes; or raw text in some encoding, lone
    surrogates written as they are (CESU-8 in UTF-8); a BOM in utf-8-sig and utf-16/32."""
    if codec == "ascii":
        return json.dumps(obj).encode()
    return json.dumps(obj, ensure_ascii=False).encode(codec, "surrogatepass")


def chunk_of(values: list, topic: str = "t", timestamps: list | None = None) -> Chunk:
    n = len(values)
    return Chunk(topic, 0, 0, list(range(n)), timestamps or [NOW] * n, [b"k"] * n, values)


def mutate(event: dict, ops: list[tuple[float | str, str, object, int]]) -> dict:
    """Apply (where, how, value, pick) ops to a deep copy: `where` picks one (container, key) of the
    event (a field name, or a fraction of the way through all its slots, nested ones included);
    `poison` turns the value there into a hostile one of the same type, so it passes the type checks."""
    e = copy.deepcopy(event)
    for where, how, value, pick in ops:
        slots = list(_slots(e))
        container, key = (e, where) if type(where) is str else slots[int(where * len(slots))]
        if how == "drop":
            if isinstance(container, dict):
                container.pop(key, None)
        elif how == "null":
            container[key] = None
        elif how == "poison":
            container[key] = _poison(container.get(key) if isinstance(container, dict) else container[key],
                                     value, pick)
        else:
            container[key] = value
    return e


def _poison(old, value: object, i: int) -> object:
    if type(old) is str:
        return [old + "\ud800", "\udc00" + old, "\ufeff" + old, old + "\x00"][i]  # BOM, NUL: they land
    if type(old) in (int, float):
        return [float("nan"), float("inf"), 2**31 + old, 10**400][i]
    if type(old) is list:
        return [old + [float("nan")], old + [2**31], [_nest(MAX_DEPTH + 1)], old + ["\ud800"]][i]
    return value


def _slots(v, depth=0):
    if depth > 4:
        return
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in list(items):
        yield v, k
        yield from _slots(x, depth + 1)


# Where: one of the event's fields by name, any slot of the event, or any contract field by name.
FIELD_NAMES = sorted({f.name for cls in EVENT_TYPES.values() for f in dataclasses.fields(cls)} | {"type"})


def mutations(event: dict) -> st.SearchStrategy:
    where = st.sampled_from(sorted(event)) | st.floats(0, 1, exclude_max=True) | st.sampled_from(FIELD_NAMES)
    return st.lists(st.tuples(where, st.sampled_from(["drop", "null", "set", "poison", "poison"]), json_values,
                              st.sampled_from(range(4))), max_size=3)


mutated = st.sampled_from(VALID).flatmap(lambda e: st.tuples(st.just(e), mutations(e)))


@settings(SETTINGS, max_examples=300)
@given(st.binary(max_size=3000))
def test_decode_message_on_any_bytes_raises_only_validation_errors(value):
    check_decodes(value)


@settings(SETTINGS, max_examples=300)
@given(json_values, codecs)
def test_decode_message_on_any_json_raises_only_validation_errors(obj, codec):
    check_decodes(encode(obj, codec))


@settings(SETTINGS, max_examples=1000)
@given(mutated)
def test_what_validate_event_accepts_as_a_dict_decode_accepts_as_bytes(case):
    """The gateway validates dicts, ingest bytes: what passes the door must pass ingest."""
    e = mutate(*case)
    try:
        validate_event(e)
    except ValidationError as err:
        assert err.reason != INTERNAL_ERROR, err
        return
    raw = json.dumps(e, allow_nan=False).encode()  # must not raise: the event is plain JSON
    assert decode_message(raw, len(raw)) == e
    strict_json(raw.decode())
    strict_row(DUCK, raw.decode(), e["type"])


@settings(SETTINGS, max_examples=40)
@given(st.lists(st.tuples(mutated, codecs), min_size=1, max_size=10))
def test_a_chunk_of_mutated_events_accounts_for_every_message_and_lands_only_readable_rows(cases):
    values = [encode(mutate(*case), codec) for case, codec in cases]
    values += [json.dumps(e).encode() for e in VALID]  # the valid traffic around them
    events, bad = decode_chunk(chunk_of(values), MAX, "run", NOW)
    assert events.num_rows + bad.num_rows == len(values)
    assert INTERNAL_ERROR not in bad.column("reason").to_pylist()
    assert {e["event_id"] for e in VALID} <= set(events.column("event_id").to_pylist())
    with tempfile.TemporaryDirectory() as root:
        land_tables(Path(root), events, bad)
        counts = query_views(Path(root))
    assert counts["events"] == events.num_rows and counts["quarantine"] == bad.num_rows


@SETTINGS
@given(st.integers(1, 3000), st.sampled_from(["arguments", "note"]))
def test_nesting_is_bounded_at_max_depth_as_bytes_and_as_dicts(depth, field):
    """`depth` levels of objects under a tool call's field: lands up to MAX_DEPTH (the event is
    level 1), quarantined past it with the same reason as bytes (json.loads) and as a dict (gateway)."""
    event = next(e for e in VALID if e["type"] == "tool_call")
    text = json.dumps(event | {field: "@@"}).replace('"@@"', '{"x": ' * (depth - 1) + "{}" + "}" * (depth - 1))
    nested: dict = {}
    for _ in range(depth - 1):
        nested = {"x": nested}
    as_dict = event | {field: nested}
    outcomes = []
    for check in (lambda: decode_message(text.encode(), 10**6), lambda: validate_event(as_dict)):
        try:
            check()
            outcomes.append(None)
        except ValidationError as err:
            outcomes.append(err.reason)
    want = None if depth + 1 <= MAX_DEPTH else "invalid_value"
    assert outcomes == [want, want]


def test_every_hostile_class_gets_its_outcome():
    for case in corpus(MAX):
        try:
            decode_message(case.raw, MAX)
            got, error = None, ""
        except ValidationError as err:
            got, error = err.reason, str(err)
        assert (got, case.needle in error) == (case.reason, True), (case.name, error)


def test_an_unexpected_decode_failure_quarantines_that_message_only(monkeypatch):
    real = decode_module.decode_message

    def buggy(value, max_bytes):
        if b"POISON" in value:
            raise KeyError("a bug")
        return real(value, max_bytes)

    monkeypatch.setattr(decode_module, "decode_message", buggy)
    values = [json.dumps(e).encode() for e in VALID]
    values.insert(3, json.dumps(VALID[0] | {"event_id": "x", "note": "POISON"}).encode())
    events, bad = decode_chunk(chunk_of(values), MAX, "run", NOW)
    assert events.num_rows == len(VALID)
    assert bad.column("reason").to_pylist() == [INTERNAL_ERROR] and bad.column("row").to_pylist() == [3]
    assert "KeyError" in bad.column("error")[0].as_py() and bad.column("raw_value")[0].as_py() == values[3]


def test_a_row_that_breaks_the_table_is_found_by_bisection(monkeypatch):
    """Defence in depth: a validator bug lets through what Arrow cannot store; only that row goes."""
    real = decode_module.decode_message

    def lets_an_int_id_through(value, max_bytes):
        e = real(value, max_bytes)
        return e | {"event_id": 12345} if e["event_id"] == VALID[7]["event_id"] else e

    monkeypatch.setattr(decode_module, "decode_message", lets_an_int_id_through)
    values = [json.dumps(e).encode() for e in VALID]
    events, bad = decode_chunk(chunk_of(values), MAX, "run", NOW)
    assert events.num_rows == len(VALID) - 1 and bad.column("row").to_pylist() == [7]
    assert bad.column("reason").to_pylist() == [INTERNAL_ERROR]
    assert "building the events table failed" in bad.column("error")[0].as_py()
    assert events.column("row").to_pylist() == [i for i in range(len(VALID)) if i != 7]


def test_quarantine_rows_build_whatever_kafka_timestamp_a_message_has():
    values = [b"junk"] * 4
    _, bad = decode_chunk(chunk_of(values, timestamps=[None, -1, 2**62, NOW]), MAX, "run", NOW)
    assert bad.num_rows == 4 and set(bad.column("day").to_pylist()) == {"2023-11-14"}


def test_a_topic_mapped_to_a_tenant_quarantines_events_claiming_another():
    acme = [e for e in VALID if e["tenant"] == "acme"]
    other = [e for e in VALID if e["tenant"] != "acme"]
    assert acme and other
    values = [json.dumps(e).encode() for e in acme + other]
    for topic, landed in [("acme.events", len(acme)), ("shared", len(values))]:
        d = Decoder(MAX, 0, "run", NOW, topic_tenants={"acme.events": "acme"})
        d.submit(chunk_of(values, topic=topic))
        events, bad = d.results()
        assert events.num_rows == landed and set(bad.column("reason").to_pylist()) <= {"tenant_mismatch"}
        if bad.num_rows:
            assert "'globex'" in bad.column("error")[0].as_py() and "acme.events" in bad.column("error")[0].as_py()


def test_topic_tenants_is_read_from_toml_and_checked(tmp_path):
    path = tmp_path / "tracerl.toml"
    path.write_text('[ingest.topic_tenants]\n"acme.events" = "acme"\n')
    assert load_config(path).ingest.topic_tenants == {"acme.events": "acme"}
    path.write_text('[ingest.topic_tenants]\n"acme.events" = "../etc"\n')
    with pytest.raises(ValueError, match="topic_tenants"):
        load_config(path)
