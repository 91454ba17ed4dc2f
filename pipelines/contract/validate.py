"""Validation of raw Kafka messages against the trace contract.

Validators are compiled once from the dataclasses in `events.py` (their type
hints are the schema), so ingest checks every message at a few microseconds
each without a generic JSON-Schema engine on the hot path. Unknown fields are
kept, never rejected: that is how newer producers add optional fields.

Validation is *total*: for any input, `decode_message` and `validate_event`
return a valid event or raise `ValidationError` (an unexpected failure inside
the validator is reported as `internal_error`, never as another exception).
And what passes is safe for every later reader, not only for Python: DuckDB's
JSON parser, Arrow's column types and Parquet's timestamps (see
`docs/trace-contract.md`, "What ingest accepts").
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from array import array
from datetime import datetime, timezone
from typing import Any, Callable, Literal

import orjson

from pipelines.contract.events import (
    EVENT_TYPES, MAX_USER, SUPPORTED_SCHEMA_VERSIONS, V1_ADAPTER_VERSION, Event, Feedback, Minimum, ModelTurn,
)

# Reasons a message is quarantined; stable strings, queryable in the lake.
NOT_JSON = "not_json"
NOT_OBJECT = "not_object"
OVERSIZE = "oversize"
UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
UNKNOWN_EVENT_TYPE = "unknown_event_type"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
INVALID_VALUE = "invalid_value"
TENANT_MISMATCH = "tenant_mismatch"  # an event claiming another tenant than its topic's (`ingest.topic_tenants`)
INTERNAL_ERROR = "internal_error"    # a bug in tracerl, not in the message: the raw bytes are kept to replay it

MAX_DEPTH = 32                       # objects and arrays nested in one event (json.loads recurses)
# The UTC range of event_time: Parquet/Arrow timestamps and every Python date conversion hold it.
TIME_MIN = datetime(1970, 1, 1, tzinfo=timezone.utc)
TIME_MAX = datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=timezone.utc)
_I64_MIN, _I64_MAX = -2**63, 2**63 - 1
_I32_MAX = 2**31 - 1
# Counts and indexes the views read as INTEGER (int32).
_INT32_FIELDS = ("turn_index", "attempt", "turns")
# The SDK fills these at construction; other producers must send them (as the JSON Schema says).
_WIRE_REQUIRED = frozenset({"event_id", "event_time", "schema_version"})


class ValidationError(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


Check = Callable[[Any, str], None]


def _fail_type(path: str, want: str, got: Any) -> None:
    raise ValidationError(WRONG_TYPE, f"{path} must be {want}, got {type(got).__name__} {short(got)}")


def _fail_number(path: str, want: type, got: Any) -> None:
    """Not a number of the wanted kind: a wrong type; or the right type out of range: an invalid value."""
    if type(got) is int or (want is float and type(got) is float):
        raise ValidationError(INVALID_VALUE, f"{path} must be a finite number that fits a 64-bit "
                                             f"{'integer' if want is int else 'float'}, got {short(got)}")
    _fail_type(path, "an integer" if want is int else "a number", got)


def short(v: Any) -> str:
    """``repr(v)``, bounded: how every error message echoes a caller's input (an id of kilobytes
    is named by its start and its length, never repeated whole)."""
    s = repr(v)  # ASCII-safe enough for a log line: repr escapes surrogates and control characters
    return s if len(s) <= 60 else f"{s[:57]}... ({len(s)} chars)"


def _is_int(v: Any) -> bool:
    return type(v) is int and _I64_MIN <= v <= _I64_MAX


def _is_num(v: Any) -> bool:
    """A number a float64 column holds exactly enough: a finite float, or an int64."""
    return (type(v) is float and v - v == 0.0) or _is_int(v)


def _compile(hint: Any) -> tuple[Check, bool]:
    """Return (check, nullable) for a type hint. A check takes (value, path, depth) and also
    enforces what every reader needs of its part of the event (see `_walk`), so each value is
    visited once: typed fields by their check, untyped ones (`Any`, objects, unknown fields) by `_walk`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        check, _ = _compile(args[0] if len(args) == 1 else Any)
        return check, True
    if origin is typing.Annotated:
        inner, bounds = _compile(typing.get_args(hint)[0])[0], [m for m in hint.__metadata__ if type(m) is Minimum]
        def check(v, p, d):
            inner(v, p, d)
            for m in bounds:
                if v < m.value:
                    note = f" ({m.note})" if m.note else ""
                    raise ValidationError(INVALID_VALUE, f"{p} must be at least {m.value}{note}, got {short(v)}")
        return check, False
    if hint is Any:
        return _any, False
    if hint is str:
        def check(v, p, d):
            if type(v) is not str:
                _fail_type(p, "a string", v)
            if not v.isascii():
                _at(p, _scalar, v)
        return check, False
    if hint is bool:
        def check(v, p, d):
            if type(v) is not bool:
                _fail_type(p, "a boolean", v)
        return check, False
    if hint is int:
        def check(v, p, d):
            if not _is_int(v):
                _fail_number(p, int, v)
        return check, False
    if hint is float:
        def check(v, p, d):
            if not _is_num(v):
                _fail_number(p, float, v)
        return check, False
    if origin is Literal:
        allowed = typing.get_args(hint)
        def check(v, p, d):
            if type(v) is not str or v not in allowed:
                raise ValidationError(INVALID_VALUE, f"{p} must be one of {list(allowed)}, got {short(v)}")
        return check, False
    if origin is list:
        (item,) = typing.get_args(hint)
        if item in (int, float):
            code, ok = ("q", _is_int) if item is int else ("d", _is_num)
            def check(v, p, d):
                if type(v) is not list:
                    _fail_type(p, "a list of integers" if item is int else "a list of numbers", v)
                try:  # C-speed element check: a token list has hundreds of items
                    array(code, v)
                    if item is int or _finite_sum(v):
                        return
                except (TypeError, OverflowError):
                    pass
                i = next(i for i, x in enumerate(v) if not ok(x))
                _fail_number(f"{p}[{i}]", item, v[i])
            return check, False
        item_check, _ = _compile(item)
        def check(v, p, d):
            if type(v) is not list:
                _fail_type(p, "a list", v)
            for i, x in enumerate(v):
                item_check(x, f"{p}[{i}]", d + 1)
        return check, False
    if origin is dict:
        def check(v, p, d):
            if type(v) is not dict:
                _fail_type(p, "an object", v)
            _at(p, _walk, v, d)
        return check, False
    if dataclasses.is_dataclass(hint):
        obj = _compile_object(hint)
        return obj, False
    raise TypeError(f"no validator for type hint {hint!r}")


def _compile_object(cls: type) -> Check:
    hints = typing.get_type_hints(cls, include_extras=True)  # keeps Annotated bounds (`Minimum`)
    fields = []
    for f in dataclasses.fields(cls):
        check, nullable = _compile(hints[f.name])
        required = (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                    or f.name in _WIRE_REQUIRED)
        fields.append((f.name, check, nullable, required))
    names = frozenset(f.name for f in dataclasses.fields(cls)) | ({"type"} if issubclass(cls, Event) else set())

    def check(v, p, d):
        if type(v) is not dict:
            _fail_type(p or "event", "an object", v)
        if d > MAX_DEPTH:
            _at(p, _walk, v, d)  # raises: too deep
        present = 1 if "type" in names and "type" in v else 0
        for name, fcheck, nullable, required in fields:
            x = v.get(name)
            path = f"{p}.{name}" if p else name
            if x is None:
                if required and (name not in v or not nullable or name in _WIRE_REQUIRED):
                    raise ValidationError(MISSING_FIELD, f"{path} is required")
                present += name in v
                continue
            present += 1
            fcheck(x, path, d + 1)
        if present < len(v):  # unknown fields, kept: any JSON that every reader can read
            _at(p, _walk, {k: v[k] for k in v.keys() - names}, d)
    return check


def _any(v: Any, p: str, d: int) -> None:
    if type(v) in (dict, list, tuple):
        _at(p, _walk, v, d)
    else:
        _at(p, _scalar, v)


class _Bad(Exception):
    """A failure deep in an event's JSON; collects its path on the way up."""

    def __init__(self, reason: str, what: str):
        self.reason, self.what, self.path = reason, what, []


def _at(prefix: str, check: Callable, *args: Any) -> None:
    """Run a `_walk`/`_scalar` check below `prefix`; its failure becomes a ValidationError naming the path."""
    try:
        check(*args)
    except _Bad as bad:
        inner = "".join(f"[{k}]" if type(k) is int else f".{k}" for k in reversed(bad.path))
        path = (prefix + inner).lstrip(".")
        raise ValidationError(bad.reason, f"{short(path) if path else 'the event'} {bad.what}") from None


def _scalar(x: Any) -> None:
    t = type(x)
    if t is str:
        if not x.isascii():
            try:
                x.encode()
            except UnicodeEncodeError as e:
                raise _Bad(INVALID_VALUE, f"holds a lone surrogate \\u{ord(x[e.start]):04x} at character {e.start}: "
                                          "strings must be valid Unicode") from None
    elif t is float:
        if x - x != 0.0:
            raise _Bad(INVALID_VALUE, f"must be a finite number, got {x!r}")
    elif t is int:
        if not _I64_MIN <= x <= _I64_MAX:
            try:
                float(x)
            except OverflowError:
                raise _Bad(INVALID_VALUE, f"{short(x)} does not fit a 64-bit float") from None
    elif x is not None and t is not bool:
        raise _Bad(WRONG_TYPE, f"is a {t.__name__}, not a JSON value")


def _numbers(v: list) -> bool:
    """Whether `v` is all finite numbers, at C speed (tokens and logprobs are long lists)."""
    try:
        array("q", v)
        return True
    except (TypeError, OverflowError):
        pass
    try:
        array("d", v)
    except (TypeError, OverflowError):
        return False
    return _finite_sum(v)


def _finite_sum(v: list) -> bool:
    """NaN and infinity survive a sum (a sum that overflows sends the list to the one-by-one check)."""
    s = sum(v)
    return s - s == 0.0


def _walk(v: dict | list, depth: int) -> None:
    """Every value below `v` (at `depth`) is JSON that any reader can parse back (DuckDB, Arrow,
    Parquet): string keys, strings without lone surrogates, finite numbers, bounded nesting."""
    if depth > MAX_DEPTH:
        raise _Bad(INVALID_VALUE, f"nests objects and arrays deeper than {MAX_DEPTH} levels")
    items = v.items() if type(v) is dict else (() if _numbers(v) else enumerate(v))
    for k, x in items:
        t = type(x)
        try:
            if type(k) is str:
                if not k.isascii():
                    _scalar(k)
            elif type(v) is dict:
                raise _Bad(WRONG_TYPE, f"has the key {short(k)}: object keys must be strings")
            if t is dict or t is list or t is tuple:
                _walk(x, depth + 1)
            elif t is not str or not x.isascii():
                _scalar(x)
        except _Bad as bad:
            bad.path.append(k)
            raise


def _check_turn(e: dict) -> None:
    ids, lps = e.get("output_token_ids"), e.get("output_logprobs")
    if lps is not None and (ids is None or len(ids) != len(lps)):
        raise ValidationError(
            INVALID_VALUE,
            f"output_logprobs has {len(lps)} entries but output_token_ids has "
            f"{'none' if ids is None else len(ids)}: send one logprob per sampled token",
        )
    for name in ("output_token_ids", "prompt_token_ids"):
        tokens = e.get(name)
        if tokens:
            try:  # the views read token ids as INTEGER[]: 0 <= id < 2**31, at C speed
                array("i", tokens), array("I", tokens)
            except OverflowError:
                i = next(i for i, x in enumerate(tokens) if not 0 <= x <= _I32_MAX)
                raise ValidationError(INVALID_VALUE, f"{name}[{i}] = {tokens[i]} is not a token id "
                                                     f"(0 to {_I32_MAX})") from None


_FEEDBACK_NEEDS = {"thumbs": "value", "rating": "value", "edit": "text", "follow_up": "text"}


def _check_feedback(e: dict) -> None:
    kind = e["kind"]
    need = _FEEDBACK_NEEDS.get(kind)
    if need and e.get(need) is None:
        raise ValidationError(MISSING_FIELD, f"{need} is required for feedback kind {kind!r}")
    if kind == "thumbs" and e["value"] not in (1, -1):
        raise ValidationError(INVALID_VALUE, f"thumbs value must be 1 (up) or -1 (down), got {short(e['value'])}")
    if kind == "rating":
        lo, hi = e.get("scale_min"), e.get("scale_max")
        lo, hi = 1 if lo is None else lo, 5 if hi is None else hi  # null = not sent: the default scale
        if not lo < hi or not lo <= e["value"] <= hi:
            raise ValidationError(INVALID_VALUE, f"rating {e['value']} is outside its scale [{lo}, {hi}]")


_EXTRA: dict[type[Event], Callable[[dict], None]] = {ModelTurn: _check_turn, Feedback: _check_feedback}
_VALIDATORS = {name: (_compile_object(cls), _EXTRA.get(cls), tuple(f for f in _INT32_FIELDS if f in fields))
               for name, cls in EVENT_TYPES.items()
               for fields in [{f.name for f in dataclasses.fields(cls)}]}
# Fields each event type defines: ingest copies an envelope column (e.g. turn_id) only from these.
FIELDS: dict[str, frozenset[str]] = {name: frozenset(f.name for f in dataclasses.fields(cls))
                                     for name, cls in EVENT_TYPES.items()}


# Tenant and task ids name lake partitions and adapter folders: keep them path-safe.
IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _check_ident(obj: dict, name: str) -> None:
    v = obj.get(name)
    if v is not None and not IDENT.fullmatch(v):
        raise ValidationError(INVALID_VALUE, f"{name} {short(v)} must match {IDENT.pattern} (letters, digits, . _ -)")


# What an event's `user` may not hold: C0 and C1 control characters, DEL, and the Unicode line and
# paragraph separators (a user id is one line of text; a log line or a header must not break on it).
USER_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def user_problem(v: str) -> str | None:
    """Why ``v`` (a string) is not a valid `user`, or None: empty, over `MAX_USER` characters,
    or holding a control character. One rule for the gateway (a 400) and ingest (quarantined)."""
    if not v:
        return "must not be empty (leave the field out for no user)"
    if len(v) > MAX_USER:
        return f"is {len(v)} characters, over the {MAX_USER}-character limit"
    bad = USER_CONTROL.search(v)
    if bad:
        return f"holds the control character U+{ord(bad.group()):04X} at character {bad.start()}"
    if not v.isascii():
        try:
            v.encode()
        except UnicodeEncodeError as e:
            return f"holds a lone surrogate at character {e.start}: it must be valid Unicode"
    return None


def _check_user(obj: dict) -> None:
    v = obj.get("user")
    if v is not None:
        why = user_problem(v)
        if why:
            raise ValidationError(INVALID_VALUE, f"user {why} (the id itself is not repeated here)")


def parse_time(s: str) -> datetime:
    """An event_time as an aware datetime within [TIME_MIN, TIME_MAX] once in UTC, or ValidationError."""
    try:
        t = datetime.fromisoformat(s)
    except (TypeError, ValueError):
        raise ValidationError(INVALID_VALUE, f"event_time {short(s)} is not an RFC 3339 timestamp") from None
    if t.tzinfo is None:
        raise ValidationError(INVALID_VALUE, f"event_time {short(s)} has no timezone: add 'Z' or an offset")
    try:
        utc = t.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        utc = None  # year 1 with a positive offset, year 9999 with a negative one
    if utc is None or not TIME_MIN <= utc <= TIME_MAX:
        raise ValidationError(INVALID_VALUE, f"event_time {short(s)} is outside {TIME_MIN:%Y-%m-%d} to "
                                             f"{TIME_MAX:%Y-%m-%d} UTC")
    return t


def _validate(obj: Any) -> dict:
    if type(obj) is not dict:
        raise ValidationError(NOT_OBJECT, f"an event must be a JSON object, got {type(obj).__name__}")
    version = obj.get("schema_version")
    if type(version) is not int or version not in SUPPORTED_SCHEMA_VERSIONS:
        raise ValidationError(
            UNKNOWN_SCHEMA_VERSION,
            f"schema_version {short(version)} is not supported (supported: {sorted(SUPPORTED_SCHEMA_VERSIONS)})",
        )
    kind = obj.get("type")
    entry = _VALIDATORS.get(kind) if type(kind) is str else None
    if entry is None:
        raise ValidationError(UNKNOWN_EVENT_TYPE, f"type {short(kind)} is not one of {sorted(_VALIDATORS)}")
    if version == 1:
        obj = _from_v1(obj)
    check, extra, int32_fields = entry
    check(obj, "", 1)
    for name in int32_fields:
        n = obj.get(name)
        if n is not None and not 0 <= n <= _I32_MAX:
            raise ValidationError(INVALID_VALUE, f"{name} {n} is outside 0 to {_I32_MAX}")
    _check_ident(obj, "tenant")
    _check_ident(obj, "task")
    _check_user(obj)
    parse_time(obj["event_time"])
    if extra:
        extra(obj)
    return obj


_V1_ADAPTER_VERSION = re.compile(V1_ADAPTER_VERSION)


def _from_v1(obj: dict) -> dict:
    """A schema_version 1 event read as version 2: a turn's text adapter version ("v3") is its int."""
    v = obj.get("adapter_version")
    if obj["type"] != "model_turn" or type(v) is not str:
        return obj
    m = _V1_ADAPTER_VERSION.fullmatch(v)
    if m is None:
        raise ValidationError(INVALID_VALUE, f"adapter_version {short(v)} (schema_version 1) names no adapter "
                                             f"version: send 'v<N>', or schema_version 2 with the integer N")
    return {**obj, "adapter_version": int(m.group(1))}


def validate_event(obj: Any) -> dict:
    """Check one decoded event; return it (a schema_version 1 event with its fields read as version 2's:
    `_from_v1`) or raise ValidationError (only that)."""
    try:
        return _validate(obj)
    except ValidationError:
        raise
    except Exception as e:  # a validator bug must not become a stuck stream: report it, keep the bytes
        raise ValidationError(INTERNAL_ERROR, f"the validator failed: {type(e).__name__}: {short(str(e))}") from e


def check_topic_tenant(event: dict, topic: str, topic_tenants: dict[str, str]) -> None:
    """On a topic mapped to one tenant (`ingest.topic_tenants`), only that tenant's events are accepted."""
    want = topic_tenants.get(topic)
    if want is not None and event["tenant"] != want:
        raise ValidationError(TENANT_MISMATCH, f"tenant {short(event['tenant'])} may not produce to topic "
                                               f"{short(topic)}: it carries tenant {want!r} only")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """An object whose keys are unique: readers disagree on duplicates (Python keeps the last
    value, DuckDB the first), so the value validated would not be the value read."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValidationError(INVALID_VALUE, f"key {short(dup)} appears twice in one object")
    return d


def decode_message(value: Any, max_bytes: int) -> dict:
    """Raw Kafka message value -> validated event dict, or ValidationError (only that)."""
    if value is None:
        raise ValidationError(NOT_JSON, "message has no value (tombstone)")
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ValidationError(NOT_JSON, f"message value is a {type(value).__name__}, not bytes")
    if len(value) > max_bytes:
        raise ValidationError(OVERSIZE, f"message is {len(value)} bytes, over the {max_bytes}-byte limit")
    obj = _fast_loads(value)
    return validate_event(_strict_loads(value) if obj is _SLOW else obj)


_SLOW = object()
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19  # orjson reads an integer beyond int64/uint64 as a float, the stdlib as an int


def _fast_loads(value: bytes | bytearray | memoryview) -> Any:
    """The message decoded by orjson (3x faster than the stdlib here), or `_SLOW` unless its
    answer is provably `_strict_loads`'s. orjson is strict UTF-8 and refuses a BOM, NaN and lone
    surrogates: what it refuses goes to the strict path for its error. Where they differ on what
    both accept, the message goes there too: orjson silently keeps a duplicate key's last value
    (so the members it built are counted against the colons outside strings in the raw text),
    and reads an integer of 19 digits or more as a float."""
    raw = bytes(value)
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _SLOW
    if _LONG_NUMBER in raw.translate(_DIGITS):
        return _SLOW
    return obj if _members(obj) == _colons_outside_strings(raw) else _SLOW


def _colons_outside_strings(raw: bytes) -> int:
    """How many object members a valid JSON text has: a colon outside strings is a member's, and only that.

    Escaped backslashes, then escaped quotes, are removed left to right first, so every quote left
    opens or closes a string."""
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(raw.split(b'"')[0::2]).count(b":")


def _members(v: Any) -> int:
    """How many members the objects in `v` hold, all together."""
    t = type(v)
    if t is dict:
        n = len(v)
        for x in v.values():
            t = type(x)
            if t is dict or t is list:
                n += _members(x)
        return n
    if t is not list:
        return 0
    try:  # C speed: token ids and logprobs are numbers only, no objects
        array("d", v)
        return 0
    except (TypeError, OverflowError):
        return sum(_members(x) for x in v if type(x) is dict or type(x) is list)


def _strict_loads(value: bytes | bytearray | memoryview) -> Any:
    """The reference decoder: strict UTF-8, the stdlib's JSON, duplicate keys refused, every error named."""
    try:  # strictly UTF-8: json.loads(bytes) would also take UTF-16/32 and a BOM, which the lake cannot store
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValidationError(NOT_JSON, f"value is not UTF-8: {e.reason} at byte {e.start}") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except ValidationError:
        raise
    except RecursionError:
        raise ValidationError(INVALID_VALUE, f"value nests objects and arrays deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError (a BOM too), or an integer of over 4300 digits
        raise ValidationError(NOT_JSON, f"value is not JSON: {short(str(e))}") from None
    except Exception as e:
        raise ValidationError(INTERNAL_ERROR, f"JSON decoding failed: {type(e).__name__}: {short(str(e))}") from e
