"""A raw HTTP client for the boundary tests: bodies as bytes (not only what json.dumps can write)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def call(url: str, key: str | None, body: Any = None, method: str | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, decoded JSON body) for one request; ``body`` bytes go as they are."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {}),
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, {"raw": raw.decode(errors="replace")}


def is_openai_error(body: Any) -> bool:
    err = body.get("error") if isinstance(body, dict) else None
    return isinstance(err, dict) and set(err) >= {"message", "type", "param", "code"} and \
        isinstance(err["message"], str) and bool(err["message"])
