"""One validator for every settings section, with errors that name the setting.

Why pydantic *dataclasses* rather than ``BaseModel``: the sections stay dataclasses. Stage code
and ~700 tests read them as attributes, tweak them in place (``cfg.learner.max_turns = 8``), copy
them with ``dataclasses.replace`` (which now re-validates) and log them with
``dataclasses.asdict``; frozen sections stay frozen and every ``__post_init__`` range check
still runs. What changes is that a TOML table is checked against the type annotations by one
validator instead of three hand-written dict-to-dataclass parsers.

Data from a file is validated in pydantic's *strict JSON mode*: TOML values are JSON-shaped, and
in that mode a string is a fine ``Path`` and a list a fine ``tuple``, an integer goes where a
float goes, but what a typo looks like is refused: ``"yes"`` for a bool, ``"4"`` for an int,
``8400.5`` for a port. Code that builds sections directly (``GateConfig(review=True)``) gets
pydantic's ordinary (lax) checks.

Every section is declared with ``@dataclass(config=SECTION)``: unknown keys are errors
(``extra="forbid"``). A failed validation becomes one ``ConfigError`` (a ``ValueError``) whose
lines read ``<source>: <dotted.path> = <value>: expected <type>``, ``unknown setting
'<path>'; known: ...`` or the section's own ``__post_init__`` message.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import types
import typing
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

SECTION = ConfigDict(extra="forbid", defer_build=True)  # unknown keys are errors; schemas are built at
                                                      # first use, so `tracerl --help` stays quick

T = TypeVar("T")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")  # a TOML key that needs no quotes


class ConfigError(ValueError):
    """A setting that does not fit its section; the message names it and the fix."""


def plain(value: Any) -> Any:
    """JSON-shaped data (dicts, lists, str, numbers, None) of settings, sections or overrides."""
    return to_jsonable_python(value)


def parse(tp: type[T], data: Any, source: str) -> T:
    """Validate ``data`` (TOML-shaped dicts) as ``tp``; ``source`` starts every error line."""
    try:
        return _adapter(tp).validate_json(json.dumps(plain(data)), strict=True)
    except ValidationError as e:
        raise ConfigError(describe(tp, e, source)) from None


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` deep-merged onto ``base`` (tables merge, anything else replaces).

    A table whose ``kind`` differs from the base's (the learner objective) replaces it whole:
    the fields of a policy-gradient objective mean nothing to KTO.
    """
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and value.get("kind", old.get("kind")) == old.get("kind"):
            out[key] = merge(old, value)
        else:
            out[key] = value
    return out


@functools.cache
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp)


# -- error messages ------------------------------------------------------------------------------

def describe(root: Any, error: ValidationError, source: str) -> str:
    lines = [_line(root, e) for e in error.errors(include_url=False)]
    if len(lines) == 1:
        return f"{source}: {lines[0]}"
    return f"{source}: {len(lines)} errors:\n" + "\n".join(f"  {line}" for line in lines)


def _line(root: Any, err: dict[str, Any]) -> str:
    path, tp, owner = _walk(root, err["loc"])
    kind, value = err["type"], err.get("input")
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        known = ", ".join(sorted(f.name for f in dataclasses.fields(owner))) if owner else "?"
        return f"unknown setting {path!r}; known here: {known}"
    if kind == "value_error":  # a section's own __post_init__ check; its message names the setting
        msg = str(err["ctx"]["error"]) if "ctx" in err else err["msg"]
        parent, _, last = path.rpartition(".")
        if not path or msg.startswith(f"{path}") or msg.startswith("targets."):
            return msg
        if msg.startswith(f"{last}.") or msg.startswith(f"{last}="):
            return f"{parent}.{msg}" if parent else msg
        return f"{path}: {msg}"
    if kind == "missing":
        return f"{path}: missing"
    if kind == "union_tag_invalid":
        ctx = err.get("ctx", {})
        return f"{path + '.' if path else ''}kind = {ctx.get('tag')!r}: choose one of {ctx.get('expected_tags')}"
    return f"{path or '(top level)'} = {value!r}: expected {_type_name(tp)}"


def _members(tp: Any) -> list[Any]:
    """The concrete types an annotation allows (Annotated and unions flattened)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _members(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return [m for arg in typing.get_args(tp) for m in _members(arg)]
    return [tp]


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _tag(cls: type) -> Any:
    f = getattr(cls, "__dataclass_fields__", {}).get("kind")
    return getattr(f, "default", None)


def _key(item: Any) -> str:
    return str(item) if _BARE_KEY.fullmatch(str(item)) else json.dumps(str(item))


def _walk(root: Any, loc: tuple) -> tuple[str, Any, type | None]:
    """(dotted setting path, its annotation or None, the dataclass the last name belongs to)."""
    tp, names, owner = root, [], None
    for item in loc:
        members = _members(tp)
        classes = [m for m in members if dataclasses.is_dataclass(m)]
        tagged = [c for c in classes if len(classes) > 1 and _tag(c) == item]
        if tagged:  # a discriminated union's tag (objective kind): not part of the setting's name
            tp = tagged[0]
            continue
        if classes and isinstance(item, str):
            owner = next((c for c in classes if item in _hints(c)), classes[0])
            tp = _hints(owner).get(item)
            names.append(item)
            continue
        mapping = next((m for m in members if m is dict or typing.get_origin(m) is dict), None)
        if mapping is not None:
            args = typing.get_args(mapping)
            tp = args[1] if args else Any
            names.append(_key(item))
            continue
        seq = next((m for m in members if m in (list, tuple) or typing.get_origin(m) in (list, tuple)), None)
        if seq is not None and isinstance(item, int):
            args = typing.get_args(seq)
            tp = args[0] if args else Any
            names[-1:] = [f"{names[-1] if names else ''}[{item}]"]
            continue
        names.append(_key(item))
        tp = None
    return ".".join(names), tp, owner


def _type_name(tp: Any) -> str:
    if tp is None:
        return "a known setting"
    members = _members(tp)
    if len(members) > 1:
        classes = [m for m in members if dataclasses.is_dataclass(m)]
        if len(classes) > 1:
            return "a table with kind = " + " | ".join(repr(_tag(c)) for c in classes)
        return " | ".join(_type_name(m) for m in members)
    m = members[0]
    if m is type(None):
        return "None"
    if dataclasses.is_dataclass(m):
        return "a table"
    if typing.get_origin(m) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(m))
    if isinstance(m, type) and not typing.get_args(m):
        return m.__name__
    return str(m).replace("typing.", "")
