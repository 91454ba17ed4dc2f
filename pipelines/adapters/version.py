"""The adapter version: an int everywhere in tracerl, parsed and formatted only here.

Adapter-store folders are ``v<N>``, vLLM's ``lora_name`` is ``<tenant>/<task>/v<N>``, the
registry's ``adapter_version`` tag is ``<N>``, and the trace contract's ``ModelTurn.adapter_version``
still carries ``"v<N>"`` (None = the base model): every reader turns those into the int through
``parse_version`` and every writer formats it with ``label``, so no module re-invents the regex.
"""

from __future__ import annotations

import re
from typing import Any

BASE = "base"                                      # the label of "no adapter": the base model
_FOLDER = re.compile(r"v([0-9]+)")                 # an adapter-store folder name, fullmatch only
_ANY = re.compile(r"(?:^|[/:])v?([0-9]+)$")        # 'v3', '3', 'acme/support/v3', 'x:v3'


def parse_version(value: str | int | None) -> int | None:
    """'v3', '3', 3, 'acme/support/v3' -> 3; None (the base model) -> 0; anything else -> None
    (the caller decides: the learner treats it as older than any version, and says so)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    m = _ANY.search(str(value).strip())
    return int(m.group(1)) if m else None


def folder_version(name: str) -> int | None:
    """N for an adapter-store folder named exactly ``v<N>``, else None (temp folders, locks)."""
    m = _FOLDER.fullmatch(name)
    return int(m.group(1)) if m else None


def label(version: int | None) -> str:
    """``v<N>``, or ``base`` for None: the folder name, the event field, and what reports print."""
    return BASE if version is None else f"v{int(version)}"


def lora_name(tenant: str, task: str, version: int) -> str:
    """vLLM's ``lora_name`` of an adapter: '<tenant>/<task>/v<N>'."""
    return f"{tenant}/{task}/{label(version)}"


def tag_version(mv: Any) -> int:
    """The adapter version a registry model version names (its ``adapter_version`` tag)."""
    return int(mv.tags["adapter_version"])
