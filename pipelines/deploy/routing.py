"""Public model names -> the adapter version live now, with in-flight counts per version.

A tenant asks for a stable public name (its task, e.g. ``"support"``, or ``"acme/support"``);
the router answers with the versioned vLLM adapter name that is live for ``(tenant, task)``,
e.g. ``"acme/support/v3"``, and counts the request against that version until it ends.
``flip`` replaces the live version in one step under a lock, so a request gets either the old
or the new version, never a mix, and a request that started on the old version keeps it to
its end (vLLM serves each name with its own weights, REFERENCE.md). ``wait_drained`` lets the
deployer unload the old version only after its last request ended.

The router is shared by the gateway's event loop (acquire/release, no awaits inside the
lock) and the deployer's worker thread (flip/wait_drained), so it uses a ``threading``
lock and condition. Routes persist in ``<home>/deploy/routes.json`` (atomic replace), so a
restarted gateway serves the same versions.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines.adapters.version import label, lora_name


def vllm_name(tenant: str, task: str, version: int) -> str:
    """The versioned adapter name in vLLM: ``tenant/task/v<N>`` (AdapterVersion.name).

    '/' cannot occur inside a tenant or task id (adapters.check_id), so names of different
    tenants never collide; each version also has its own folder, so vLLM's prefix cache
    (keyed on name and path) never mixes two versions.
    """
    return lora_name(tenant, task, version)


@dataclass
class Live:
    """The version serving a route now, and the ones before it (for rollback)."""

    tenant: str
    task: str
    version: int
    path: str
    history: list[dict[str, Any]] = field(default_factory=list)  # [{"version", "path"}], oldest first

    @property
    def name(self) -> str:
        return vllm_name(self.tenant, self.task, self.version)


@dataclass
class Lease:
    """One request's hold on a version: release it exactly once when the request ends."""

    tenant: str
    task: str
    version: int
    name: str
    failed: bool = False  # set by the gateway when vLLM answered with an error, or not at all


class UnknownModel(KeyError):
    pass


class Router:
    def __init__(self, state_path: Path | None = None):
        self._routes: dict[tuple[str, str], Live] = {}
        self._inflight: dict[str, int] = {}
        self._ended: dict[tuple[str, str], list[int]] = {}  # (tenant, task) -> [requests, failed]
        self._cond = threading.Condition()
        self._state_path = Path(state_path) if state_path else None
        if self._state_path and self._state_path.is_file():
            for raw in json.loads(self._state_path.read_text()):
                live = Live(**raw)
                self._routes[(live.tenant, live.task)] = live

    # -- the request path ---------------------------------------------------------------------

    def resolve(self, tenant: str, model: str) -> tuple[str, str]:
        """``(tenant, task)`` for a public name: ``task`` or ``tenant/task`` of this tenant."""
        owner, _, task = model.rpartition("/")
        if owner and owner != tenant:
            raise UnknownModel(model)  # another tenant's model does not exist for this one
        if (tenant, task) not in self._routes:
            raise UnknownModel(model)
        return tenant, task

    def acquire(self, tenant: str, model: str) -> Lease:
        with self._cond:
            tenant, task = self.resolve(tenant, model)
            live = self._routes[(tenant, task)]
            self._inflight[live.name] = self._inflight.get(live.name, 0) + 1
            return Lease(tenant, task, live.version, live.name)

    def release(self, lease: Lease) -> None:
        with self._cond:
            ended = self._ended.setdefault((lease.tenant, lease.task), [0, 0])
            ended[0] += 1
            ended[1] += lease.failed
            left = self._inflight.get(lease.name, 0) - 1
            if left <= 0:
                self._inflight.pop(lease.name, None)
            else:
                self._inflight[lease.name] = left
            self._cond.notify_all()

    def inflight(self, name: str) -> int:
        with self._cond:
            return self._inflight.get(name, 0)

    def ended(self, tenant: str, task: str) -> tuple[int, int]:
        """(requests, failed requests) of a route that have ended since this router started;
        the deployer reads it around a swap."""
        with self._cond:
            requests, failed = self._ended.get((tenant, task), (0, 0))
            return requests, failed

    # -- the deploy path ----------------------------------------------------------------------

    def live(self, tenant: str, task: str) -> Live | None:
        with self._cond:
            live = self._routes.get((tenant, task))
            return None if live is None else Live(**asdict(live))

    def routes(self) -> list[Live]:
        with self._cond:
            return [Live(**asdict(v)) for v in self._routes.values()]

    def public_models(self, tenant: str) -> list[dict[str, Any]]:
        with self._cond:
            return [{"id": task, "object": "model", "owned_by": tenant, "version": label(live.version)}
                    for (t, task), live in sorted(self._routes.items()) if t == tenant]

    def flip(self, tenant: str, task: str, version: int, path: str, *, rollback: bool = False) -> Live | None:
        """Make ``version`` live in one step; return the version it replaced (or None).

        Promote pushes the old version onto the history; rollback pops it (the caller has
        taken the target from ``history[-1]``).
        """
        with self._cond:
            old = self._routes.get((tenant, task))
            history = list(old.history) if old else []
            if rollback:
                if not history or history[-1]["version"] != version:
                    raise ValueError(f"{tenant}/{task}: v{version} is not the previous version")
                history.pop()
            elif old is not None:
                history.append({"version": old.version, "path": old.path})
            self._routes[(tenant, task)] = Live(tenant, task, int(version), str(path), history[-20:])
            self._save()
            return None if old is None else Live(**asdict(old))

    def wait_drained(self, name: str, timeout: float) -> bool:
        """Block until no request holds ``name``; False if ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._inflight.get(name, 0) > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _save(self) -> None:
        if self._state_path is None:
            return
        self._state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._state_path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps([asdict(v) for v in self._routes.values()], indent=1))
        os.replace(tmp, self._state_path)
