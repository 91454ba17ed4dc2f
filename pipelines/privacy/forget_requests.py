"""Forget requests and receipts on disk: what `tracerl forget` (pipelines/forget) resumes from after
a crash, what the gateway's ``POST /admin/forget`` files for the Dagster ``forget_job`` to carry out,
and the receipts every forget appends. docs/privacy.md#forget.

- ``<home>/privacy/forget/<tenant>/<pseudonym>.json``: one request per user, written atomically
  (aside, fsync'd, renamed, folder fsync'd). It holds ids only (the user's pseudonym, trace, turn
  and event ids, SHA-256 hashes of their prompts, the adapter versions marked, counts), never text
  nor the user's id in clear. ``status``: ``requested`` (filed, not started), ``running`` (a forget
  started: a rerun resumes it), ``done``.
- ``<home>/privacy/forget/receipts.jsonl``: one JSON line per completed forget (counts per store,
  times, who asked, versions marked, the policy and deadline), appended and fsync'd.

Below the lake in the import layers (only ``durable`` and the pseudonym), so the gateway can file a
request without importing what carries it out.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipelines.durable import fsync_dir, write_json_atomic
from pipelines.privacy.pseudonym import pseudonym, secret_path

REQUESTED, RUNNING, DONE = "requested", "running", "done"


def forget_dir(home: Path | str) -> Path:
    return Path(home) / "privacy" / "forget"


def request_path(home: Path | str, tenant: str, user: str) -> Path:
    """The request file of ``user`` (a pseudonym) of ``tenant`` (checked by ``secret_path``)."""
    secret_path(home, tenant)  # validates the tenant id
    return forget_dir(home) / tenant / f"{user}.json"


def load_request(home: Path | str, tenant: str, user: str) -> dict[str, Any] | None:
    path = request_path(home, tenant, user)
    return json.loads(path.read_text()) if path.is_file() else None


def save_request(home: Path | str, request: dict[str, Any]) -> None:
    path = request_path(home, request["tenant"], request["user"])
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_json_atomic(path, request)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_request(tenant: str, user: str, actor: str) -> dict[str, Any]:
    return {"id": f"forget-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}", "tenant": tenant,
            "user": user, "actor": actor, "requested_at": now_iso(), "status": REQUESTED}


def file_request(cfg: Any, tenant: str, raw_user: str, actor: str) -> dict[str, Any]:
    """Record that ``raw_user`` of ``tenant`` asked to be forgotten (the gateway's admin route):
    ``forget_job`` carries it out. An open request is returned as it is (idempotent)."""
    user = pseudonym(cfg, tenant, raw_user)
    found = load_request(cfg.home, tenant, user)
    if found is not None and found.get("status") != DONE:
        return found
    request = new_request(tenant, user, actor)
    if found is not None:  # asked again after a completed forget: the same record, run again
        request = {**found, "status": REQUESTED, "actor": actor, "requested_at": now_iso()}
    save_request(cfg.home, request)
    return request


def open_requests(home: Path | str) -> list[dict[str, Any]]:
    """Requests not done (filed, or interrupted), oldest first."""
    root, out = forget_dir(home), []
    if root.is_dir():
        for path in sorted(root.glob("*/u_*.json")):
            req = json.loads(path.read_text())
            if req.get("status") != DONE:
                out.append(req)
    return sorted(out, key=lambda r: r.get("requested_at", ""))


def all_requests(home: Path | str) -> list[dict[str, Any]]:
    root = forget_dir(home)
    return [json.loads(p.read_text()) for p in sorted(root.glob("*/u_*.json"))] if root.is_dir() else []


def receipts_path(home: Path | str) -> Path:
    return forget_dir(home) / "receipts.jsonl"


def append_receipt(home: Path | str, receipt: dict[str, Any]) -> None:
    path = receipts_path(home)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    new = not path.exists()
    with open(path, "a") as fh:
        fh.write(json.dumps(receipt, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    if new:
        fsync_dir(path.parent)


def receipts(home: Path | str) -> list[dict[str, Any]]:
    path = receipts_path(home)
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.is_file() else []


@dataclass(frozen=True)
class Forgotten:
    """What ingest must not land again: events of forgotten users still in Kafka when their forget
    ran would otherwise come back with the next ingest. Per tenant: each forgotten user's pseudonym
    with the time they asked (their events from before it; what they send after it is new data),
    and the trace and turn ids the forget found (feedback and tool calls sent without a user)."""

    users: dict[tuple[str, str], str]  # (tenant, pseudonym) -> requested_at (RFC 3339, UTC)
    traces: frozenset[tuple[str, str]]  # (tenant, trace id)
    turns: frozenset[tuple[str, str]]   # (tenant, turn id)

    def __bool__(self) -> bool:
        return bool(self.users or self.traces or self.turns)


def forgotten(home: Path | str) -> Forgotten:
    """Every forget request on file, filed, interrupted or done (`Forgotten`)."""
    users: dict[tuple[str, str], str] = {}
    traces: set[tuple[str, str]] = set()
    turns: set[tuple[str, str]] = set()
    for req in all_requests(home):
        tenant = req.get("tenant")
        users[(tenant, req.get("user"))] = max(req.get("requested_at") or "", users.get((tenant, req.get("user")), ""))
        traces.update((tenant, t) for t in req.get("trace_ids") or [])
        turns.update((tenant, t) for t in req.get("turn_ids") or [])
    return Forgotten(users, frozenset(traces), frozenset(turns))
