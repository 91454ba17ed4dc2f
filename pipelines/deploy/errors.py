"""Errors the gateway answers, all in OpenAI's format ``{"error": {message, type, param, code}}``.

Clients (the OpenAI SDKs among them) read ``error.message``, ``error.param`` and ``error.code``, so
every answer that is not a success has that shape: our own refusals (:class:`ApiError`), aiohttp's
404/405/413, vLLM's own 4xx (normalised: :func:`upstream_code`), and, as the last resort, an
unexpected exception, which is logged and answered 500 (a bug: the tests count every 5xx).

One vocabulary, here and nowhere else:

- ``type``: ``invalid_request_error`` for every 4xx (api.openai.com answers a bad key, an unknown
  model and a bad field alike with it), ``requests`` for a 429 (OpenAI's rate-limit type),
  ``server_error`` for every 5xx.
- ``code``: always a string, one of :data:`CODES`: OpenAI's own where api.openai.com has one
  (:data:`OPENAI_CODES`), else one of the few the gateway adds where OpenAI answers ``null``
  (:data:`GATEWAY_CODES`: a body that is not JSON, a trace that is not yours, the admin routes).
- ``param``: the request field at fault as OpenAI writes it (``messages[0].content``), or null.

Request validation (pydantic, ``schemas.parse``) is mapped by :func:`pydantic_error`; the finer
reason (pydantic's own ``type``, or ours such as ``too_deep`` or ``invalid_tool_choice``) stays
on :attr:`ApiError.reason` for logs and tests and in the message, never in ``code``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

log = logging.getLogger("tracerl.gateway")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

# -- OpenAI's codes, as api.openai.com answers them ------------------------------------------------
INVALID_TYPE = "invalid_type"                      # "Invalid type for 'temperature': expected a decimal, ..."
INVALID_VALUE = "invalid_value"                    # "Invalid value: 'wizard'. Supported values are: ..."
UNKNOWN_PARAMETER = "unknown_parameter"            # "Unknown parameter: 'logit_bias'."
MISSING_REQUIRED_PARAMETER = "missing_required_parameter"  # "Missing required parameter: 'messages'."
INTEGER_ABOVE_MAX_VALUE = "integer_above_max_value"  # "Invalid 'n': integer above maximum value. ..."
INTEGER_BELOW_MIN_VALUE = "integer_below_min_value"
DECIMAL_ABOVE_MAX_VALUE = "decimal_above_max_value"
DECIMAL_BELOW_MIN_VALUE = "decimal_below_min_value"
STRING_ABOVE_MAX_LENGTH = "string_above_max_length"  # "Invalid 'x': string too long. Expected ..."
ARRAY_ABOVE_MAX_LENGTH = "array_above_max_length"    # "Invalid 'tools': array too long. Expected ..."
EMPTY_ARRAY = "empty_array"                          # "Invalid 'messages': empty array. Expected ..."
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # the prompt is over the model's context (vLLM)
INVALID_API_KEY = "invalid_api_key"                  # 401
MODEL_NOT_FOUND = "model_not_found"                  # 404 on an unknown model
UNKNOWN_URL = "unknown_url"                          # 404 on a route that does not exist
RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"          # 429 (type "requests"); only an upstream's

OPENAI_CODES = frozenset({
    INVALID_TYPE, INVALID_VALUE, UNKNOWN_PARAMETER, MISSING_REQUIRED_PARAMETER, INTEGER_ABOVE_MAX_VALUE,
    INTEGER_BELOW_MIN_VALUE, DECIMAL_ABOVE_MAX_VALUE, DECIMAL_BELOW_MIN_VALUE, STRING_ABOVE_MAX_LENGTH,
    ARRAY_ABOVE_MAX_LENGTH, EMPTY_ARRAY, CONTEXT_LENGTH_EXCEEDED, INVALID_API_KEY, MODEL_NOT_FOUND, UNKNOWN_URL,
    RATE_LIMIT_EXCEEDED})

# -- the gateway's own, where OpenAI answers code null ---------------------------------------------
INVALID_JSON = "invalid_json"                # the body is not strict UTF-8 JSON (OpenAI: "could not parse")
PERMISSION_DENIED = "permission_denied"      # 403: the admin key, or another tenant's key
NOT_FOUND = "not_found"                      # 404: a trace, turn, tenant or version that is not there / not yours
CONFLICT = "conflict"                        # 409: a deploy, rollback, swap or canary refused
REQUEST_TOO_LARGE = "request_too_large"      # 413: the body, or the event it makes, over its limit
SERVICE_UNAVAILABLE = "service_unavailable"  # 503: no replica serves, or the event could not be recorded
UPSTREAM_ERROR = "upstream_error"            # 502: vLLM failed the request
SERVER_ERROR_CODE = "server_error"           # 500: a gateway bug

GATEWAY_CODES = frozenset({INVALID_JSON, PERMISSION_DENIED, NOT_FOUND, CONFLICT, REQUEST_TOO_LARGE,
                           SERVICE_UNAVAILABLE, UPSTREAM_ERROR, SERVER_ERROR_CODE})
CODES = OPENAI_CODES | GATEWAY_CODES

# the code an error gets when its raiser names none
_DEFAULT_CODE = {400: INVALID_VALUE, 401: INVALID_API_KEY, 403: PERMISSION_DENIED, 404: NOT_FOUND,
                 405: UNKNOWN_URL, 409: CONFLICT, 413: REQUEST_TOO_LARGE, 422: INVALID_VALUE,
                 429: RATE_LIMIT_EXCEEDED, 500: SERVER_ERROR_CODE, 502: UPSTREAM_ERROR, 503: SERVICE_UNAVAILABLE}


def error_type(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status."""
    if status >= 500:
        return SERVER_ERROR
    return "requests" if status == 429 else INVALID_REQUEST


def default_code(status: int) -> str:
    return _DEFAULT_CODE.get(status, SERVER_ERROR_CODE if status >= 500 else INVALID_VALUE)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    if code not in CODES:  # never fail while answering an error: an unknown code is a bug the tests catch
        if code is not None:
            log.error("error code %r is not in errors.CODES; answering %s's default", code, status)
        code = default_code(status)
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(status, message, param, code), status=status, headers=headers)


class ApiError(Exception):
    """A refusal with its HTTP status; ``param`` names the request field at fault, ``code`` is one
    of :data:`CODES` (default: the status's), ``reason`` the finer cause (logs, tests)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 reason: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code if code is not None else default_code(status)
        self.reason = reason or self.code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status)


# -- request validation (pydantic) -> OpenAI ------------------------------------------------------

_EXPECTED = {"string_type": "a string", "int_type": "an integer", "float_type": "a decimal",
             "bool_type": "a boolean", "list_type": "an array", "tuple_type": "an array", "dict_type": "an object",
             "model_type": "an object", "model_attributes_type": "an object", "dataclass_type": "an object",
             "none_required": "null", "int_from_float": "an integer"}
_TYPE_CODES = frozenset(_EXPECTED) | {"bytes_type", "json_type", "is_instance_of", "callable_type", "set_type",
                                       "frozen_set_type", "iterable_type", "arguments_type"}
_PYDANTIC_CODES = {"missing": MISSING_REQUIRED_PARAMETER, "extra_forbidden": UNKNOWN_PARAMETER,
                   "string_too_long": STRING_ABOVE_MAX_LENGTH, "too_long": ARRAY_ABOVE_MAX_LENGTH,
                   **dict.fromkeys(_TYPE_CODES, INVALID_TYPE)}
# contract ValidationError reasons (pipelines.contract.validate) -> OpenAI
_CONTRACT_CODES = {"missing_field": MISSING_REQUIRED_PARAMETER, "wrong_type": INVALID_TYPE,
                   "oversize": REQUEST_TOO_LARGE, "not_json": INVALID_JSON, "not_object": INVALID_TYPE}


def json_kind(value: Any) -> str:
    """A JSON value's type as OpenAI's messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, (list, tuple)) else "an object"


def _limit(ctx: dict[str, Any], above: bool) -> tuple[str, Any]:
    for key, op in ((("le", "<="), ("lt", "<")) if above else (("ge", ">="), ("gt", ">"))):
        if key in ctx:
            return op, ctx[key]
    return "", None


def pydantic_code(kind: str, value: Any = None, ctx: dict[str, Any] | None = None) -> str:
    """The OpenAI code of one pydantic error (its ``type``, input and context)."""
    if kind in _PYDANTIC_CODES:
        return _PYDANTIC_CODES[kind]
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        decimal = isinstance(value, float) or any(isinstance(v, float) for v in (ctx or {}).values())
        above = kind.startswith("less")
        return {(False, False): INTEGER_BELOW_MIN_VALUE, (False, True): INTEGER_ABOVE_MAX_VALUE,
                (True, False): DECIMAL_BELOW_MIN_VALUE, (True, True): DECIMAL_ABOVE_MAX_VALUE}[(decimal, above)]
    if kind == "too_short" and isinstance(value, (list, tuple)) and not value:
        return EMPTY_ARRAY
    return INVALID_VALUE  # literal_error, string_pattern_mismatch, too_short, our own validators' kinds, ...


def pydantic_error(error: dict[str, Any], param: str | None, more: int = 0) -> ApiError:
    """:class:`ApiError` 400 for pydantic's first error (``errors(include_url=False)``), worded as
    OpenAI words it, pydantic's ``type`` kept as the reason."""
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    code = pydantic_code(kind, value, ctx)
    where = f"'{param}'" if param else "the body"
    if code == INVALID_TYPE:
        expected = _EXPECTED.get(kind)
        message = (f"Invalid type for {where}: expected {expected}, but got {json_kind(value)} instead."
                   if expected else f"Invalid type for {where}: {error['msg']}.")
    elif code == UNKNOWN_PARAMETER:
        message = f"Unknown parameter: {where}."
    elif code == MISSING_REQUIRED_PARAMETER:
        message = f"Missing required parameter: {where}" + (
            "." if error["msg"] == "Field required" else f": {error['msg']}.")
    elif code in (INTEGER_ABOVE_MAX_VALUE, INTEGER_BELOW_MIN_VALUE, DECIMAL_ABOVE_MAX_VALUE, DECIMAL_BELOW_MIN_VALUE):
        above = code.endswith("above_max_value")
        op, bound = _limit(ctx, above)
        bound = f"{bound:g}" if isinstance(bound, float) else bound  # 2.0 -> 2, as OpenAI writes it
        message = (f"Invalid {where}: {code.split('_')[0]} {'above maximum' if above else 'below minimum'} value. "
                   f"Expected a value {op} {bound}, but got {str(value)[:40]} instead.")
    elif code == STRING_ABOVE_MAX_LENGTH and isinstance(value, str):
        message = (f"Invalid {where}: string too long. Expected a string with maximum length "
                   f"{ctx.get('max_length')}, but got a string with length {len(value)} instead.")
    elif code == ARRAY_ABOVE_MAX_LENGTH and isinstance(value, (list, tuple)):
        message = (f"Invalid {where}: array too long. Expected an array with maximum length "
                   f"{ctx.get('max_length')}, but got an array with length {len(value)} instead.")
    elif code == EMPTY_ARRAY:
        message = (f"Invalid {where}: empty array. Expected an array with minimum length "
                   f"{ctx.get('min_length', 1)}, but got an empty array instead.")
    else:
        message = f"Invalid {where}: {error['msg']}"
    if more:
        message += f" (and {more} more)"
    return ApiError(400, message, param, code, reason=kind)


def contract_code(reason: str) -> str:
    """The OpenAI code of a contract ``ValidationError.reason`` (the event a request would make)."""
    return _CONTRACT_CODES.get(reason, INVALID_VALUE)


def upstream_code(status: int, message: str) -> str:
    """vLLM's own 4xx (``type: BadRequestError``, ``code: 400``) in this vocabulary."""
    if status == 400 and "maximum context length" in message:
        return CONTEXT_LENGTH_EXCEEDED
    if status == 404:
        return MODEL_NOT_FOUND  # the adapter went away under the request (a swap): the model, for the client
    return default_code(status)


@web.middleware
async def errors_as_json(request: web.Request, handler) -> web.StreamResponse:
    """Every failure leaves as an OpenAI-style JSON error; nothing escapes as aiohttp's text page."""
    try:
        return await handler(request)
    except ApiError as err:
        return err.response()
    except web.HTTPException as err:
        if err.status < 400:
            raise
        headers = {k: v for k, v in err.headers.items() if k.lower() == "allow"}
        message = {404: f"no route {request.method} {request.path}",
                   405: f"{request.method} is not allowed on {request.path}",
                   413: "request body too large"}.get(err.status, err.text or err.reason)
        code = UNKNOWN_URL if err.status in (404, 405) else None
        return error_response(err.status, message, code=code, headers=headers)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as err:  # noqa: BLE001 - a bug; the client still gets JSON, the log the traceback
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, f"internal error ({type(err).__name__}); this is a gateway bug")
