"""The adapter version: an int everywhere in tracerl, parsed and formatted only here.

The trace contract's ``ModelTurn.adapter_version``, the lake's ``turns.adapter_version`` and the
``trained_turns`` ledger carry the int itself (None / NULL = the base model), and the gateway's
``tracerl.adapter_version`` answers it. Text appears only where a name or a human needs it:
adapter-store folders are ``v<N>`` (``folder_version``), vLLM's ``lora_name`` is
``<tenant>/<task>/v<N>``, reports print ``label``, and the registry's ``adapter_version`` tag is
``<N>`` because MLflow tags are strings (``tag_version`` is its one reader). ``parse_version``
is for what a person or a path supplies (a CLI argument, a folder or lora name), never for data.
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
    """``v<N>``, or ``base`` for None: the folder name and what reports print."""
    return BASE if version is None else f"v{int(version)}"


def lora_name(tenant: str, task: str, version: int) -> str:
    """vLLM's ``lora_name`` of an adapter: '<tenant>/<task>/v<N>'."""
    return f"{tenant}/{task}/{label(version)}"


def tag_version(mv: Any) -> int:
    """The adapter version a registry model version names (its ``adapter_version`` tag, ``<N>``)."""
    raw = mv.tags.get("adapter_version")
    if raw is None or not (raw.isascii() and raw.isdigit()):
        raise ValueError(f"registry model {mv.name} version {mv.version}: its adapter_version tag is {raw!r}, "
                         f"not an adapter version number (the learner writes '3' for the adapter store's v3)")
    return int(raw)
