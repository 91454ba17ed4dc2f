"""Ingest decodes with orjson where it can prove the answer is the stdlib's: for every input,
`decode_message` returns the same event (the same JSON, ints still ints) or the same reason as the
strict reference decoder (strict UTF-8, `json.loads` with duplicate keys refused).

The inputs aim at where orjson and the stdlib part ways: duplicate keys (orjson keeps the last
silently), integers beyond 64 bits (orjson reads them as floats), escapes that hide quotes,
backslashes and colons, any whitespace, BOMs, NaN and lone surrogates.
"""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipelines.contract import validate
from pipelines.contract.validate import ValidationError, decode_message, validate_event
from pipelines.ingest.sample import generate
from tests.ingest.test_decode_properties import SETTINGS, VALID, codecs, encode, json_values, mutated, mutate

MAX = 1 << 20


def reference(value: bytes) -> dict:
    return validate_event(validate._strict_loads(value))


def outcome(decode, value: bytes) -> tuple[str, str]:
    """("ok", the event as JSON text: 1 and 1.0 differ) or ("error", the reason)."""
    try:
        return "ok", json.dumps(decode(value), allow_nan=True)
    except ValidationError as err:
        return "error", err.reason


def same(value: bytes) -> None:
    assert outcome(lambda v: decode_message(v, MAX), value) == outcome(reference, value), value[:300]


# JSON text written by hand, so objects can repeat a key and whitespace can be anything JSON allows.
ws = st.sampled_from(["", " ", "  ", "\n", "\t", "\r\n ", " \n\t"])
tricky_strings = st.sampled_from(['a"b', "a\\b", "a:b", '\\"', '":"', "\\\\", "\\:", 'x\\":', "\u003a", "\ud800",
                                  "\ufeff", "é:ü", '"', ":", ""])
keys = st.sampled_from(["a", "b", "type", "event_id", "a:b", 'q"', "\\", "é"]) | tricky_strings
big_ints = st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1, -(10**19), 10**19, 10**25,
                            -(10**30), 1234567890123456789012])
leaf = st.one_of(json_values.filter(lambda v: not isinstance(v, (dict, list))), tricky_strings, big_ints)


def _text(node, draw_ws: list[str], ascii_only: bool) -> str:
    w = draw_ws[len(str(node)) % len(draw_ws)]
    if isinstance(node, tuple) and node[0] == "obj":
        return "{" + w + ("," + w).join(f"{json.dumps(k, ensure_ascii=ascii_only)}{w}:{w}{_text(v, draw_ws, ascii_only)}"
                                         for k, v in node[1]) + w + "}"
    if isinstance(node, tuple) and node[0] == "arr":
        return "[" + ",".join(_text(v, draw_ws, ascii_only) for v in node[1]) + "]"
    return json.dumps(node, ensure_ascii=ascii_only)


nodes = st.recursive(
    leaf, lambda inner: st.tuples(st.just("arr"), st.lists(inner, max_size=4))
    | st.tuples(st.just("obj"), st.lists(st.tuples(keys, inner), max_size=5)), max_leaves=20)
texts = st.builds(lambda n, w, a: _text(n, w, a), nodes, st.lists(ws, min_size=1, max_size=3), st.booleans())


@settings(SETTINGS, max_examples=600)
@given(texts, st.sampled_from(["utf-8", "utf-8-sig"]))
@example('{"a": 1, "a": 2}', "utf-8")
@example('{"a": "x\\":1", "b": [{"c": 1, "c": 2}]}', "utf-8")
@example('{"a": "\\u003a", "a": 2}', "utf-8")
@example('[-9999999999999999999, 18446744073709551616]', "utf-8")
def test_hand_written_json_decodes_as_the_reference_does(text, codec):
    same(text.encode(codec, "surrogatepass"))


@settings(SETTINGS, max_examples=300)
@given(st.binary(max_size=2000))
def test_any_bytes_decode_as_the_reference_does(value):
    same(value)


@settings(SETTINGS, max_examples=300)
@given(json_values, codecs)
def test_any_json_decodes_as_the_reference_does(obj, codec):
    same(encode(obj, codec))


@settings(SETTINGS, max_examples=400)
@given(mutated, st.sampled_from(range(6)), keys, leaf, st.booleans())
def test_events_with_a_key_repeated_or_a_value_changed_decode_as_the_reference_does(case, at, key, value, ascii_only):
    """Valid events, mutated, then a member repeated or inserted in their text: still as the reference."""
    e = mutate(*case)
    text = json.dumps(e, ensure_ascii=ascii_only)
    names = list(e)
    member = f'"{names[at % len(names)]}": {json.dumps(value)}' if at % 2 else f"{json.dumps(key)}: {json.dumps(value)}"
    same(text.encode("utf-8", "surrogatepass"))
    same(("{" + member + ", " + text[1:]).encode("utf-8", "surrogatepass"))


def test_sample_traffic_takes_the_fast_path():
    """What the simulated apps send (tokens, logprobs, text with quotes and newlines) is decoded by orjson."""
    values = [json.dumps(e.to_dict()).encode() for e in generate(40, seed=3)]
    values += [json.dumps(e | {"note": 'he said "stop":\n\\ done'}).encode() for e in VALID]
    assert all(validate._fast_loads(v) is not validate._SLOW for v in values)
    assert [decode_message(v, MAX) for v in values] == [reference(v) for v in values]
