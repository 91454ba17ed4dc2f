"""Validation of raw Kafka messages against the trace contract.

Validators are compiled once from the dataclasses in `events.py` (their type
hints are the schema), so ingest checks every message at a few microseconds
each without a generic JSON-Schema engine on the hot path. Unknown fields are
kept, never rejected: that is how newer producers add optional fields.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from array import array
from datetime import datetime
from typing import Any, Callable, Literal

from pipelines.contract.events import EVENT_TYPES, SUPPORTED_SCHEMA_VERSIONS, Event, Feedback, ModelTurn

# Reasons a message is quarantined; stable strings, queryable in the lake.
NOT_JSON = "not_json"
NOT_OBJECT = "not_object"
OVERSIZE = "oversize"
UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
UNKNOWN_EVENT_TYPE = "unknown_event_type"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
INVALID_VALUE = "invalid_value"


class ValidationError(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


Check = Callable[[Any, str], None]


def _fail_type(path: str, want: str, got: Any) -> None:
    raise ValidationError(WRONG_TYPE, f"{path} must be {want}, got {type(got).__name__} {_short(got)}")


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _compile(hint: Any) -> tuple[Check, bool]:
    """Return (check, nullable) for a type hint."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        check, _ = _compile(args[0] if len(args) == 1 else Any)
        return check, True
    if hint is Any:
        return (lambda v, p: None), False
    if hint is str:
        def check(v, p):
            if type(v) is not str:
                _fail_type(p, "a string", v)
        return check, False
    if hint is bool:
        def check(v, p):
            if type(v) is not bool:
                _fail_type(p, "a boolean", v)
        return check, False
    if hint is int:
        def check(v, p):
            if type(v) is not int:
                _fail_type(p, "an integer", v)
        return check, False
    if hint is float:
        def check(v, p):
            if type(v) is not float and type(v) is not int:
                _fail_type(p, "a number", v)
        return check, False
    if origin is Literal:
        allowed = typing.get_args(hint)
        def check(v, p):
            if v not in allowed or type(v) is bool:
                raise ValidationError(INVALID_VALUE, f"{p} must be one of {list(allowed)}, got {_short(v)}")
        return check, False
    if origin is list:
        (item,) = typing.get_args(hint)
        if item in (int, float):
            code, want = ("q", "a list of integers") if item is int else ("d", "a list of numbers")
            def check(v, p):
                if type(v) is not list:
                    _fail_type(p, want, v)
                try:  # C-speed element check: a token list has hundreds of items
                    array(code, v)
                except (TypeError, OverflowError):
                    _fail_type(p, want, next(x for x in v if not _is_num(x, item)))
            return check, False
        item_check, _ = _compile(item)
        def check(v, p):
            if type(v) is not list:
                _fail_type(p, "a list", v)
            for i, x in enumerate(v):
                item_check(x, f"{p}[{i}]")
        return check, False
    if origin is dict:
        def check(v, p):
            if type(v) is not dict:
                _fail_type(p, "an object", v)
        return check, False
    if dataclasses.is_dataclass(hint):
        obj = _compile_object(hint)
        return obj, False
    raise TypeError(f"no validator for type hint {hint!r}")


def _is_num(x: Any, item: type) -> bool:
    if item is int:
        return type(x) is int and -(2**63) <= x < 2**63
    return type(x) in (int, float)


def _compile_object(cls: type) -> Check:
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        check, nullable = _compile(hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append((f.name, check, nullable, required))

    def check(v, p):
        if type(v) is not dict:
            _fail_type(p or "event", "an object", v)
        for name, fcheck, nullable, required in fields:
            x = v.get(name)
            path = f"{p}.{name}" if p else name
            if x is None:
                if required and (name not in v or not nullable):
                    raise ValidationError(MISSING_FIELD, f"{path} is required")
                continue
            fcheck(x, path)
    return check


def _check_turn(e: dict) -> None:
    ids, lps = e.get("output_token_ids"), e.get("output_logprobs")
    if lps is not None and (ids is None or len(ids) != len(lps)):
        raise ValidationError(
            INVALID_VALUE,
            f"output_logprobs has {len(lps)} entries but output_token_ids has "
            f"{'none' if ids is None else len(ids)}: send one logprob per sampled token",
        )


_FEEDBACK_NEEDS = {"thumbs": "value", "rating": "value", "edit": "text", "follow_up": "text"}


def _check_feedback(e: dict) -> None:
    kind = e["kind"]
    need = _FEEDBACK_NEEDS.get(kind)
    if need and e.get(need) is None:
        raise ValidationError(MISSING_FIELD, f"{need} is required for feedback kind {kind!r}")
    if kind == "thumbs" and e["value"] not in (1, -1):
        raise ValidationError(INVALID_VALUE, f"thumbs value must be 1 (up) or -1 (down), got {_short(e['value'])}")
    if kind == "rating":
        lo, hi = e.get("scale_min", 1), e.get("scale_max", 5)
        if not lo < hi or not lo <= e["value"] <= hi:
            raise ValidationError(INVALID_VALUE, f"rating {e['value']} is outside its scale [{lo}, {hi}]")


_EXTRA: dict[type[Event], Callable[[dict], None]] = {ModelTurn: _check_turn, Feedback: _check_feedback}
_VALIDATORS = {name: (_compile_object(cls), _EXTRA.get(cls)) for name, cls in EVENT_TYPES.items()}


# Tenant and task ids name lake partitions and adapter folders: keep them path-safe.
_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _check_ident(obj: dict, name: str) -> None:
    v = obj.get(name)
    if v is not None and not _IDENT.fullmatch(v):
        raise ValidationError(INVALID_VALUE, f"{name} {_short(v)} must match {_IDENT.pattern} (letters, digits, . _ -)")


def parse_time(s: str) -> datetime:
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        raise ValidationError(INVALID_VALUE, f"event_time {_short(s)} is not an RFC 3339 timestamp") from None
    if t.tzinfo is None:
        raise ValidationError(INVALID_VALUE, f"event_time {_short(s)} has no timezone: add 'Z' or an offset")
    return t


def validate_event(obj: Any) -> dict:
    """Check one decoded event; return it unchanged or raise ValidationError."""
    if type(obj) is not dict:
        raise ValidationError(NOT_OBJECT, f"an event must be a JSON object, got {type(obj).__name__}")
    version = obj.get("schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS or type(version) is not int:
        raise ValidationError(
            UNKNOWN_SCHEMA_VERSION,
            f"schema_version {_short(version)} is not supported (supported: {sorted(SUPPORTED_SCHEMA_VERSIONS)})",
        )
    kind = obj.get("type")
    entry = _VALIDATORS.get(kind) if type(kind) is str else None
    if entry is None:
        raise ValidationError(UNKNOWN_EVENT_TYPE, f"type {_short(kind)} is not one of {sorted(_VALIDATORS)}")
    check, extra = entry
    check(obj, "")
    _check_ident(obj, "tenant")
    _check_ident(obj, "task")
    parse_time(obj["event_time"])
    if extra:
        extra(obj)
    return obj


def decode_message(value: bytes | None, max_bytes: int) -> dict:
    """Raw Kafka message value -> validated event dict, or ValidationError."""
    if value is None:
        raise ValidationError(NOT_JSON, "message has no value (tombstone)")
    if len(value) > max_bytes:
        raise ValidationError(OVERSIZE, f"message is {len(value)} bytes, over the {max_bytes}-byte limit")
    try:
        obj = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValidationError(NOT_JSON, f"value is not UTF-8 JSON: {e}") from None
    return validate_event(obj)
