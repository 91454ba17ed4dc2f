"""Prompt hashing: the one key eval items, the learner's exclusion and the gate's contamination
check all match on, so a prompt is an eval prompt everywhere or nowhere."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from typing import Any

_WS = re.compile(r"\s+")


def normalize(text: str) -> str:
    """NFKC, casefold, collapse whitespace, strip: 'Hello  World ' == 'hello world'."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def prompt_hash(messages: list[dict[str, Any]]) -> str:
    """sha256 of the normalized (role, content) list: the item id MLflow sees, and the key the
    learner's exclusion and the gate's contamination check match on."""
    canon = [[str(m.get("role", "")), normalize(str(m.get("content") or ""))] for m in messages]
    return hashlib.sha256(json.dumps(canon, separators=(",", ":")).encode()).hexdigest()


def last_user_hash(messages: list[dict[str, Any]]) -> str | None:
    """sha256 of the last user message alone (catches an eval prompt under another system prompt)."""
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        return None
    return hashlib.sha256(("user:" + normalize(str(users[-1].get("content") or ""))).encode()).hexdigest()
