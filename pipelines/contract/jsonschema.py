"""JSON Schema for the trace contract, generated from the event dataclasses.

Apps in other languages validate against the shipped file
`trace_event.schema.json`; a test keeps it equal to what this module
generates. Regenerate with `tracerl schema --write`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pipelines.contract.events import EVENT_TYPES, SCHEMA_VERSION, Minimum

SCHEMA_PATH = Path(__file__).with_name("trace_event.schema.json")


def _type(hint: Any, defs: dict) -> dict:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return {"anyOf": [_type(args[0], defs), {"type": "null"}]}
    if origin is typing.Annotated:
        bounds = [m.value for m in hint.__metadata__ if type(m) is Minimum]
        return _type(typing.get_args(hint)[0], defs) | ({"minimum": max(bounds)} if bounds else {})
    if hint is Any:
        return {}
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if hint in simple:
        return {"type": simple[hint]}
    if origin is Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin is list:
        return {"type": "array", "items": _type(typing.get_args(hint)[0], defs)}
    if origin is dict:
        return {"type": "object"}
    if dataclasses.is_dataclass(hint):
        defs.setdefault(hint.__name__, _object(hint, defs))
        return {"$ref": f"#/$defs/{hint.__name__}"}
    raise TypeError(hint)


def _object(cls: type, defs: dict, event_type: str | None = None) -> dict:
    hints = typing.get_type_hints(cls, include_extras=True)
    props: dict[str, Any] = {}
    required = []
    if event_type:
        props["type"] = {"const": event_type}
        required.append("type")
    for f in dataclasses.fields(cls):
        props[f.name] = _type(hints[f.name], defs)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
        elif f.name in ("event_id", "event_time", "schema_version"):
            required.append(f.name)  # the SDK fills these; other producers must send them
    out: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if cls.__doc__:
        out["description"] = " ".join(cls.__doc__.split())
    return out  # additionalProperties stays open: newer producers may add optional fields


def build_schema() -> dict:
    defs: dict[str, Any] = {}
    variants = {name: _object(cls, defs, name) for name, cls in EVENT_TYPES.items()}
    for name, schema in variants.items():
        schema["properties"]["schema_version"] = {"const": SCHEMA_VERSION}
        defs[EVENT_TYPES[name].__name__] = schema
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://tracerl.dev/schema/trace_event.v{SCHEMA_VERSION}.json",
        "title": f"tracerl trace event, schema_version {SCHEMA_VERSION}",
        "oneOf": [{"$ref": f"#/$defs/{EVENT_TYPES[n].__name__}"} for n in EVENT_TYPES],
        "$defs": dict(sorted(defs.items())),
    }


def render() -> str:
    return json.dumps(build_schema(), indent=2) + "\n"


def write(path: Path = SCHEMA_PATH) -> Path:
    path.write_text(render())
    return path
