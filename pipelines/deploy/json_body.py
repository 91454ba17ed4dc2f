"""Parse a request body as strict JSON: what the lake cannot hold is refused at the door.

Python's ``json`` is lenient where the rest of the loop is not: it reads ``NaN`` / ``Infinity``
(and ``1e400`` as infinity), ``"\\ud800"`` as a lone surrogate that no UTF-8 encoder will write,
integers of any size, and nests until the interpreter's stack runs out (RecursionError). Each of
those later fails the emitter, ingest or a view, so each is a 400 here, with the path of the
offending value. The ``code`` is OpenAI's where the value has a path (``invalid_value``,
``integer_above_max_value``), else the gateway's ``invalid_json`` (``errors``); the finer cause
is the error's ``reason``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pipelines.deploy.errors import (INTEGER_ABOVE_MAX_VALUE, INTEGER_BELOW_MIN_VALUE, INVALID_JSON, INVALID_VALUE,
                                     ApiError)

INT64 = (-(2 ** 63), 2 ** 63 - 1)


def _refuse_constant(name: str) -> Any:
    raise ApiError(400, f"{name} is not allowed: JSON numbers must be finite", code=INVALID_JSON,
                   reason="non_finite_number")


def parse_json(raw: bytes, max_depth: int) -> Any:
    """``raw`` -> a JSON value, or :class:`ApiError` 400 naming what was wrong."""
    try:
        text = raw.decode("utf-8")  # strict: CESU-8 surrogates, UTF-16, stray bytes are refused
    except UnicodeDecodeError as err:
        raise ApiError(400, f"body is not UTF-8: {err.reason} at byte {err.start}", code=INVALID_JSON,
                       reason="invalid_encoding") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ApiError(400, f"body nests deeper than {max_depth} levels", code=INVALID_JSON,
                       reason="too_deep") from None
    except ValueError as err:  # JSONDecodeError, or an integer too long to convert
        raise ApiError(400, f"body is not valid JSON: {err}", code=INVALID_JSON, reason="invalid_json") from None
    check_value(value, max_depth)
    return value


def _path(parts: tuple) -> str | None:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def check_value(value: Any, max_depth: int) -> None:
    """Walk ``value`` without recursion: depth, finite numbers, int64 range, encodable strings."""
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        v, where = stack.pop()
        if len(where) > max_depth:
            raise ApiError(400, f"{_path(where)} nests deeper than {max_depth} levels", _path(where),
                           code=INVALID_VALUE, reason="too_deep")
        if isinstance(v, dict):
            for k, x in v.items():
                _check_str(k, where + (k,))
                stack.append((x, where + (k,)))
        elif isinstance(v, list):
            stack.extend((x, where + (i,)) for i, x in enumerate(v))
        elif isinstance(v, str):
            _check_str(v, where)
        elif isinstance(v, bool) or v is None:
            pass
        elif isinstance(v, int):
            if not INT64[0] <= v <= INT64[1]:
                raise ApiError(400, f"{_path(where) or 'body'}: integer {str(v)[:24]}... is outside the 64-bit range",
                               _path(where), code=INTEGER_ABOVE_MAX_VALUE if v > 0 else INTEGER_BELOW_MIN_VALUE,
                               reason="integer_out_of_range")
        elif isinstance(v, float) and not math.isfinite(v):
            raise ApiError(400, f"{_path(where) or 'body'}: number overflows to {v}; numbers must be finite",
                           _path(where), code=INVALID_VALUE, reason="non_finite_number")


def _check_str(s: str, where: tuple) -> None:
    if s.isascii():
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ApiError(400, f"{_path(where) or 'body'}: lone surrogate {s[err.start]!r} at character {err.start} "
                            "is not a Unicode character", _path(where), code=INVALID_VALUE,
                       reason="invalid_unicode") from None
