"""A corpus of hostile messages: every class that once made decode raise or landed rows the
views could not read, each with the outcome ingest must give it.

`corpus()` yields `Case`s: raw bytes, the quarantine reason expected (None: it must land,
normalised or as sent) and a needle the quarantine error must contain (the field it names).
The events claim tenant `mallory`, so tests can tell them from the valid traffic around them.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.contract.events import V1_ADAPTER_VERSION, Feedback, Message, ModelTurn, SessionEnd, ToolCall
from pipelines.lake.tables import EVENTS_SCHEMA, QUARANTINE_SCHEMA
from pipelines.lake.query import TYPED_VIEWS, V1_SOURCES, connect
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS, QUARANTINE

TENANT = "mallory"
T = "2026-11-30T10:00:00.000Z"


@dataclass(frozen=True)
class Case:
    name: str
    raw: bytes | None
    reason: str | None  # None: must land
    needle: str = ""    # a word the quarantine error must contain


def base(kind: str, n: int) -> dict:
    """A valid event of `kind`, unique by `n`."""
    env = dict(tenant=TENANT, app="evil", trace_id=f"tr-m-{n}", event_id=f"ev-m-{n}", event_time=T, task="x")
    if kind == "model_turn":
        e = ModelTurn(**env, turn_id=f"tu-m-{n}", turn_index=0, model="m",
                      input_messages=[Message(role="user", content="hi")], output_text="ok",
                      output_token_ids=[1, 2], output_logprobs=[-0.1, -0.2], prompt_token_ids=[3])
    elif kind == "feedback":
        e = Feedback(**env, turn_id=f"tu-m-{n}", kind="rating", value=4)
    elif kind == "tool_call":
        e = ToolCall(**env, turn_id=f"tu-m-{n}", name="t", outcome="ok", arguments={"a": 1})
    else:
        e = SessionEnd(**env, outcome="completed", turns=1)
    return e.to_dict()


def _dumps(d: dict, **kw) -> bytes:
    return json.dumps(d, **kw).encode()


def _with(event_type: str, n: int, drop: tuple[str, ...] = (), **changes) -> dict:
    d = base(event_type, n)
    for k in drop:
        d.pop(k)
    d.update(changes)
    return d


def _splice(kind: str, n: int, field: str, raw_json: str) -> bytes:
    """A valid event whose `field` holds raw JSON text (NaN, huge literals, escapes) as written."""
    d = base(kind, n)
    d[field] = "@@"
    return json.dumps(d).replace('"@@"', raw_json).encode()


def corpus(max_bytes: int = 64 * 1024, seed: int = 0) -> list[Case]:
    n = iter(range(10**6))
    c: list[Case] = []

    def add(name, raw, reason, needle=""):
        c.append(Case(name, raw, reason, needle))

    # very deep nesting: past json's recursion limit, and just past the contract's depth
    deep = max_bytes // 2 - 200
    add("deep_nesting_recursion", _splice("tool_call", next(n), "arguments", "[" * deep + "]" * deep),
        "invalid_value", "deeper")
    add("deep_nesting_40", _dumps(_with("tool_call", next(n), arguments=_nest(40))), "invalid_value", "deeper")
    add("nesting_30_lands", _dumps(_with("tool_call", next(n), arguments=_nest(28))), None)
    # envelope fields the SDK fills but the wire must carry
    for field in ("event_id", "event_time"):
        add(f"missing_{field}", _dumps(_with("feedback", next(n), drop=(field,))), "missing_field", field)
        add(f"null_{field}", _dumps(_with("feedback", next(n), **{field: None})), "missing_field", field)
    # timestamps outside what a UTC conversion, Arrow or a date partition holds
    for name, t in [("year_1_plus_offset", "0001-01-01T00:30:00+01:00"),
                    ("year_9999_minus_offset", "9999-12-31T23:30:00-01:00"),
                    ("year_1_utc", "0001-01-01T00:00:00Z"), ("no_timezone", "2026-11-30T10:00:00"),
                    ("not_a_time", "yesterday")]:
        add(f"time_{name}", _dumps(_with("session_end", next(n), event_time=t)), "invalid_value", "event_time")
    add("time_9999_utc_lands", _dumps(_with("session_end", next(n), event_time="9999-12-31T23:00:00Z")), None)
    # lone surrogates, as JSON escapes, in every kind of string position
    add("surrogate_in_text", _splice("model_turn", next(n), "output_text", '"ok \\ud800"'), "invalid_value",
        "output_text")
    add("surrogate_low_in_id", _splice("feedback", next(n), "trace_id", '"\\udc00x"'), "invalid_value", "trace_id")
    add("surrogate_in_nested", _dumps(_with("model_turn", next(n), input_messages=[
        {"role": "user", "content": "\ud83d"}])), "invalid_value", "input_messages[0].content")
    add("surrogate_in_key", _dumps(_with("tool_call", next(n), arguments={"\udfff": 1})), "invalid_value",
        "arguments")
    add("surrogate_in_unknown_field", _splice("session_end", next(n), "note", '"\\ud800"'), "invalid_value", "note")
    add("surrogate_pair_lands", _splice("model_turn", next(n), "output_text", '"ok \\ud83d\\ude00"'), None)
    # encodings that are not UTF-8
    d = _with("model_turn", next(n), output_text="caf\u00e9 \ud800")
    add("cesu8_bytes", json.dumps(d, ensure_ascii=False).encode("utf-8", "surrogatepass"), "not_json", "UTF-8")
    add("utf16_with_bom", json.dumps(base("feedback", next(n))).encode("utf-16"), "not_json", "UTF-8")
    add("utf16_le", json.dumps(base("feedback", next(n))).encode("utf-16-le"), "not_json", "JSON")
    add("utf32", json.dumps(base("feedback", next(n))).encode("utf-32"), "not_json", "UTF-8")
    add("utf8_bom", b"\xef\xbb\xbf" + _dumps(base("feedback", next(n))), "not_json", "BOM")
    add("latin1", json.dumps(_with("feedback", next(n), kind="comment", text="caf\u00e9"),
                             ensure_ascii=False).encode("latin-1"), "not_json", "UTF-8")
    # schema_version of the wrong type
    for name, v in [("string", "1"), ("float", 1.0), ("list", [1]), ("object", {"v": 1}), ("bool", True),
                    ("null", None)]:
        add(f"schema_version_{name}", _dumps(_with("feedback", next(n), schema_version=v)),
            "unknown_schema_version", "schema_version")
    add("type_is_a_list", _dumps(_with("feedback", next(n), type=["feedback"])), "unknown_event_type", "type")
    # ratings with null scale bounds: null means "not sent", the default 1..5
    add("rating_null_scale_lands", _dumps(_with("feedback", next(n), scale_min=None, scale_max=None)), None)
    add("rating_null_scale_out_of_range", _dumps(_with("feedback", next(n), scale_min=None, value=9)),
        "invalid_value", "rating")
    # an integer where an id string belongs
    for field, kind in [("event_id", "feedback"), ("trace_id", "feedback"), ("turn_id", "tool_call"),
                        ("tenant", "model_turn"), ("app", "session_end"), ("call_id", "tool_call")]:
        add(f"int_{field}", _dumps(_with(kind, next(n), **{field: 42})), "wrong_type", field)
    add("int_turn_id_on_session_end_lands", _dumps(_with("session_end", next(n), turn_id=42)), None)
    # the adapter version is the int itself (null: the base model), never the folder name "v3"
    for name, v, reason, needle in [("string_v3", "v3", "wrong_type", "adapter_version must be an integer, got str"),
                                    ("string_3", "3", "wrong_type", "adapter_version must be an integer"),
                                    ("float", 3.0, "wrong_type", "adapter_version must be an integer"),
                                    ("zero", 0, "invalid_value", "adapter_version must be at least 1")]:
        add(f"adapter_version_{name}", _dumps(_with("model_turn", next(n), adapter_version=v)), reason, needle)
    add("adapter_version_int_lands", _dumps(_with("model_turn", next(n), adapter_version=3)), None)
    add("adapter_version_null_lands", _dumps(_with("model_turn", next(n), adapter_version=None)), None)
    # schema_version 1 sent the version as text: "v4" and "4" read as 4, other text names no version
    for name, v in [("v4", "v4"), ("4", "4")]:
        add(f"v1_adapter_version_{name}_lands", _dumps(_with("model_turn", next(n), schema_version=1,
                                                             adapter_version=v)), None)
    for name, v, needle in [("base", "base", "names no adapter version"), ("v0", "v0", "at least 1"),
                            ("newline", "v4\n", "names no adapter version"),
                            ("arabic_digit", "v\u0664", "names no adapter version"),
                            ("huge", "v" + "9" * 30, "adapter_version")]:
        add(f"v1_adapter_version_{name}", _dumps(_with("model_turn", next(n), schema_version=1, adapter_version=v)),
            "invalid_value", needle)
    add("v1_adapter_version_int_lands", _dumps(_with("model_turn", next(n), schema_version=1, adapter_version=5)), None)
    # non-finite numbers: json.loads takes NaN and Infinity, DuckDB takes NaN
    for lit in ("NaN", "Infinity", "-Infinity", "1e400"):
        add(f"{lit}_in_value", _splice("feedback", next(n), "value", lit), "invalid_value", "value")
        add(f"{lit}_in_unknown_field", _splice("session_end", next(n), "score", lit), "invalid_value", "score")
    add("nan_in_logprobs", _splice("model_turn", next(n), "output_logprobs", "[-0.1, NaN]"), "invalid_value",
        "output_logprobs")
    add("nan_in_sampling", _splice("model_turn", next(n), "sampling", '{"temperature": Infinity}'),
        "invalid_value", "temperature")
    # integers beyond int64 (and int32 where the views read INTEGER)
    add("turn_index_2_64", _dumps(_with("model_turn", next(n), turn_index=2**64)), "invalid_value", "turn_index")
    add("turn_index_2_31", _dumps(_with("model_turn", next(n), turn_index=2**31)), "invalid_value", "turn_index")
    add("turns_2_40", _dumps(_with("session_end", next(n), turns=2**40)), "invalid_value", "turns")
    add("attempt_negative", _dumps(_with("tool_call", next(n), attempt=-1)), "invalid_value", "attempt")
    add("token_id_2_31", _dumps(_with("model_turn", next(n), output_token_ids=[1, 2**31])), "invalid_value",
        "output_token_ids[1]")
    add("prompt_token_negative", _dumps(_with("model_turn", next(n), prompt_token_ids=[-1])), "invalid_value",
        "prompt_token_ids[0]")
    add("token_id_2_63", _dumps(_with("model_turn", next(n), output_token_ids=[1, 2**63])), "invalid_value",
        "output_token_ids[1]")
    add("int_10_30_unknown_lands", _dumps(_with("session_end", next(n), big=10**30)), None)
    add("int_400_digits_unknown", _splice("session_end", next(n), "big", "9" * 400), "invalid_value", "big")
    add("int_5000_digits", _splice("session_end", next(n), "big", "9" * 5000), "not_json", "digits")
    add("scale_max_10_400", _splice("feedback", next(n), "scale_max", "1" + "0" * 400), "invalid_value", "scale_max")
    # readers disagree on duplicate keys (Python keeps the last, DuckDB the first)
    dup = json.dumps(base("model_turn", next(n)))[:-1] + ', "output_token_ids": [3000000000]}'
    add("duplicate_key", dup.encode(), "invalid_value", "output_token_ids")
    # shapes
    add("tombstone", None, "not_json", "tombstone")
    add("empty", b"", "not_json")
    add("json_array", b"[1, 2]", "not_object")
    add("json_string", b'"feedback"', "not_object")
    add("control_chars_land", _splice("model_turn", next(n), "output_text", '"a\\u0000b\\u001f"'), None)
    add("oversize_10mb", b"{" + b" " * (10 << 20) + b"}", "oversize")
    rng = random.Random(seed)
    for i in range(8):
        add(f"random_bytes_{i}", b"\x80" + rng.randbytes(rng.randrange(1, 600)), "not_json")
    return c


def _nest(depth: int) -> dict:
    v: object = 1
    for _ in range(depth - 1):
        v = [v]
    return {"x": v}


VIEWS = ("events", "turns", "tool_calls", "feedback", "session_ends", "quarantine", "rewards",
         "reward_corrections")


def land_tables(root: Path, events: pa.Table, quarantine: pa.Table) -> None:
    """Commit decoded tables (`decode_chunk`'s output) to the lake at `root`, as ingest stages them."""
    delta.append(root, QUARANTINE, quarantine.select(QUARANTINE_SCHEMA.names + ["day"])
                 .rename_columns(QUARANTINE_SCHEMA.names + ["date"]))
    delta.append(root, EVENTS, events.select(EVENTS_SCHEMA.names + ["tenant", "day"])
                 .rename_columns(EVENTS_SCHEMA.names + ["tenant", "date"]))


def query_views(root: Path) -> dict[str, int]:
    """`SELECT *` from every lake view, fully materialised; {view: rows}. Raises if one cannot be read.

    The views are defensive (TRY_CAST), so this also reads every landed row *strictly*, as the
    views would without that defence: a plain CAST of each typed column, the payload as JSON by
    DuckDB and by a strict RFC 8259 parser, every hot number finite."""
    con = connect(root)
    counts = {v: len(con.execute(f"SELECT * FROM {v}").fetchall()) for v in VIEWS}
    for view, (event_type, cols) in TYPED_VIEWS.items():
        strict = ", ".join(_strict(view, name, src, t, "payload", "schema_version") if src.startswith("$") else src
                           for name, src, t in cols)
        con.execute(f"SELECT {strict}, payload::JSON FROM events WHERE type = '{event_type}'").fetchall()
    floats = [f.name for f in EVENTS_SCHEMA if f.type == pa.float64()]
    bad = " OR ".join(f"NOT isfinite({c})" for c in floats)
    assert con.execute(f"SELECT count(*) FROM events WHERE {bad}").fetchone()[0] == 0
    for (payload,) in con.execute("SELECT payload FROM events").fetchall():
        strict_json(payload)
    return counts


def strict_row(con, payload: str, event_type: str) -> None:
    """Read one payload as its typed view would without TRY_CAST (in memory: no lake needed)."""
    view = next(v for v, (etype, _) in TYPED_VIEWS.items() if etype == event_type)
    strict = ", ".join(_strict(view, name, src, t, "p", "CAST(json_extract(p, '$.schema_version') AS INT)")
                       for name, src, t in TYPED_VIEWS[view][1] if src.startswith("$"))
    con.execute(f"SELECT {strict}, p::JSON FROM (SELECT ?::VARCHAR AS p)", [payload]).fetchall()


def _strict(view: str, name: str, src: str, sql_type: str, payload: str, version: str) -> str:
    """A typed column read without TRY_CAST; a v1 row's text adapter version must match its pattern."""
    plain = f"CAST(json_extract({payload}, '{src}') AS {sql_type})"
    if (view, name) not in V1_SOURCES:
        return plain
    v1 = f"CAST(regexp_extract(json_extract_string({payload}, '{src}'), '^{V1_ADAPTER_VERSION}$', 1) AS {sql_type})"
    return f"CASE WHEN {version} = 1 THEN {v1} ELSE {plain} END"


def strict_json(text: str) -> object:
    """RFC 8259 and nothing more: no NaN/Infinity, finite numbers, unique keys, valid Unicode."""
    def unique(pairs):
        assert len({k for k, _ in pairs}) == len(pairs), f"duplicate key in {text[:80]!r}"
        return dict(pairs)

    def no_constant(c):
        raise AssertionError(f"{c} is not JSON")

    def finite(s):
        assert abs(float(s)) != float("inf"), f"{s} overflows a double"
        return float(s)

    obj = json.loads(text, object_pairs_hook=unique, parse_constant=no_constant, parse_float=finite)
    json.dumps(obj, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate
    return obj
