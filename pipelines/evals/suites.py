"""Eval suites: files the user owns, outside the trace lake.

Layout: ``<suites_dir>/<tenant>/<task>/<suite>.toml``, each naming a JSONL file of items::

    name = "correctness"
    role = "primary"            # "primary" decides promotion; "guardrail" must not regress
    tolerance = 0.02            # guardrail: largest acceptable drop of the mean score
    items = "correctness.jsonl" # relative to the TOML file
    [scorer]
    kind = "similarity"         # see scorers.py for every kind and its fields

Each JSONL line: ``{"id"?: str, "messages": [{"role","content"}...], "reference"?: str, ...}``;
extra fields (``pattern``, ``schema``, ``tools``) feed the scorers. Item ids are never logged
in clear: ``item_hash`` (sha256 of the normalized prompt) is what MLflow sees.

``<suites_dir>/_template/`` (README + a suite of placeholder items) is what ``tracerl tenant add``
copies for a new tenant/task. Its items carry ``"placeholder": true``; the gate refuses to promote
on a suite holding any (``suite_problem``), and says so, until they are replaced.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.evals.hashing import prompt_hash
from pipelines.evals.scorers import Scorer, parse_scorer

ROLES = ("primary", "guardrail")
TEMPLATE = "_template"          # <suites_dir>/_template/: the scaffold (not a tenant: ids start alnum)
PLACEHOLDER = "placeholder"     # an item field: true on the template's example items
REFUSE_PLACEHOLDERS = ("the gate will refuse to promote on the template's placeholder items until "
                       "they are replaced")
@dataclass(frozen=True)
class Item:
    messages: list[dict[str, Any]]
    reference: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hash(self) -> str:
        return prompt_hash(self.messages)

    @property
    def placeholder(self) -> bool:
        """A template example (``"placeholder": true``), not a real eval item."""
        return self.extra.get(PLACEHOLDER) is True


@dataclass(frozen=True)
class Suite:
    name: str
    role: str
    scorer: Scorer
    items: list[Item]
    tolerance: float = 0.0
    path: str = ""

    @property
    def fingerprint(self) -> str:
        """sha256 over the sorted item hashes: tells whether two gates saw the same items."""
        return hashlib.sha256("".join(sorted(i.hash for i in self.items)).encode()).hexdigest()


def load_suite(path: Path) -> Suite:
    path = Path(path)
    try:
        spec = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from None
    unknown = sorted(set(spec) - {"name", "role", "tolerance", "items", "scorer"})
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; known: name, role, tolerance, items, scorer")
    name = spec.get("name") or path.stem
    role = spec.get("role", "primary")
    if role not in ROLES:
        raise ValueError(f"{path}: role={role!r}; use one of {ROLES}")
    tolerance = float(spec.get("tolerance", 0.0))
    if not 0.0 <= tolerance <= 1.0:
        raise ValueError(f"{path}: tolerance={tolerance} must be in [0, 1] (a drop of the mean score)")
    if "scorer" not in spec:
        raise ValueError(f"{path}: no [scorer] table; e.g. [scorer] kind = \"exact\"")
    scorer = parse_scorer(spec["scorer"], where=f"{path}: scorer")
    items_path = path.parent / spec.get("items", f"{path.stem}.jsonl")
    items = load_items(items_path)
    if not items:
        raise ValueError(f"{path}: no items in {items_path}")
    return Suite(name, role, scorer, items, tolerance, str(path))


def load_items(path: Path) -> list[Item]:
    if not Path(path).is_file():
        raise ValueError(f"items file {path} does not exist")
    items, seen = [], set()
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{path}:{n}: not JSON: {err}") from None
        msgs = obj.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
            raise ValueError(f"{path}:{n}: 'messages' must be a non-empty list of {{role, content}}")
        item = Item(msgs, obj.get("reference"), {k: v for k, v in obj.items()
                                                   if k not in ("id", "messages", "reference")})
        if item.hash in seen:
            raise ValueError(f"{path}:{n}: duplicate prompt (same normalized messages as an earlier item)")
        seen.add(item.hash)
        items.append(item)
    return items


def load_suites(suites_dir: str | Path, tenant: str, task: str) -> list[Suite]:
    """Every suite of tenant/task, sorted by name; [] when the folder does not exist."""
    folder = Path(suites_dir) / tenant / task
    if not folder.is_dir():
        return []
    suites = [load_suite(p) for p in sorted(folder.glob("*.toml"))]
    names = [s.name for s in suites]
    if len(set(names)) != len(names):
        raise ValueError(f"{folder}: suite names repeat: {names}")
    return suites


def template_dir(suites_dir: str | Path) -> Path:
    """The suite scaffold: ``<suites_dir>/_template/`` if there is one, else the one shipped with
    tracerl (``evals/_template/`` of this checkout)."""
    own = Path(suites_dir) / TEMPLATE
    return own if own.is_dir() else Path(__file__).resolve().parents[2] / "evals" / TEMPLATE


def suite_problem(suites_dir: str | Path, tenant: str, task: str, suites: list[Suite]) -> str | None:
    """Why ``suites`` (``load_suites`` of tenant/task) cannot decide a promotion, or None: there are
    none, or some still hold the template's placeholder items. The gate's reason, word for word."""
    folder = Path(suites_dir) / tenant / task
    template = template_dir(suites_dir)
    guide = template / "README.md"
    if not suites:
        return (f"no eval suites under {folder}/: the gate has nothing to compare a candidate on. "
                f"Scaffold one with `tracerl tenant add {tenant} --task {task}` (or copy "
                f"{template}/ there), then replace its placeholder items with your own "
                f"prompts: {REFUSE_PLACEHOLDERS} ({guide})")
    held = [(s, sum(i.placeholder for i in s.items)) for s in suites]
    held = [(s, n) for s, n in held if n]
    if held:
        where = ", ".join(f"{s.path or s.name}: {n} of {len(s.items)} items" for s, n in held)
        return (f"placeholder eval items in {folder}/ ({where} carry \"{PLACEHOLDER}\": true): "
                f"{REFUSE_PLACEHOLDERS} with your own held-out prompts ({guide})")
    return None
