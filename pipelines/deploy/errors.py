"""Errors the gateway answers, all in OpenAI's format ``{"error": {message, type, param, code}}``.

Clients (the OpenAI SDKs among them) read ``error.message`` and ``error.param``, so every answer
that is not a success has that shape: our own refusals (:class:`ApiError`), aiohttp's 404/405/413,
and, as the last resort, an unexpected exception, which is logged and answered 500 (a bug: the
tests count every 5xx).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

log = logging.getLogger("tracerl.gateway")

_KIND = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
         413: "request_too_large", 502: "upstream_error", 503: "unavailable_error"}


def error_body(status: int, message: str, kind: str | None = None, param: str | None = None,
               code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind or _KIND.get(status, "server_error"),
                      "param": param, "code": status if code is None else code}}


def error_response(status: int, message: str, kind: str | None = None, param: str | None = None,
                   code: str | int | None = None, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(status, message, kind, param, code), status=status, headers=headers)


class ApiError(Exception):
    """A refusal with its HTTP status; ``param`` names the request field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None,
                 code: str | int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.kind, self.param, self.code)


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
        return error_response(err.status, message, headers=headers)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as err:  # noqa: BLE001 - a bug; the client still gets JSON, the log the traceback
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, f"internal error ({type(err).__name__}); this is a gateway bug", "server_error")
