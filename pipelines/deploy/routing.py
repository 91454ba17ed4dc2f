"""Public model names -> the adapter version live now, with in-flight counts per version.

A tenant asks for a stable public name (its task, e.g. ``"support"``, or ``"acme/support"``);
the router answers with the versioned vLLM adapter name that is live for ``(tenant, task)``,
e.g. ``"acme/support/v3"``, and counts the request against that version until it ends.
``flip`` replaces the live version in one step under a lock, so a request gets either the old
or the new version, never a mix, and a request that started on the old version keeps it to
its end (vLLM serves each name with its own weights, docs/measured.md). ``wait_drained`` lets the
deployer unload the old version only after its last request ended.

The router is shared by the gateway's event loop (acquire/release, no awaits inside the
lock) and the deployer's worker thread (flip/wait_drained), so it uses a ``threading``
lock and condition. Routes persist in ``<home>/deploy/routes.json`` (atomic replace), so a
restarted gateway serves the same versions.

A route may also hold a canary (issue #15): a challenger version that serves ``share`` of the
route's conversations. Which side a conversation is on is a hash of the canary's id and the
conversation's sticky key (the request's ``user``, else its trace id) against the share, so a
conversation keeps its side across requests and across a gateway restart (the canary is in
routes.json). The side a conversation got is also pinned in memory, so changing the share moves
no conversation already served; only after a restart *and* a share change can a conversation
whose hash lies between the old and the new share change sides. Stopping the canary sends
every new request to the champion; requests on the challenger finish on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pipelines.adapters.version import label, lora_name
from pipelines.contract.events import Arm

MAX_PINS = 200_000  # conversations whose side is remembered (oldest forgotten first)


def vllm_name(tenant: str, task: str, version: int) -> str:
    """The versioned adapter name in vLLM: ``tenant/task/v<N>`` (AdapterVersion.name).

    '/' cannot occur inside a tenant or task id (adapters.check_id), so names of different
    tenants never collide; each version also has its own folder, so vLLM's prefix cache
    (keyed on name and path) never mixes two versions.
    """
    return lora_name(tenant, task, version)


def bucket(canary_id: str, sticky: str) -> float:
    """Where a conversation falls in [0, 1): uniform over keys, fixed per (canary, key). The side is
    challenger below the share. A new canary has a new id, so it draws its own conversations."""
    digest = hashlib.sha256(f"{canary_id}\0{sticky}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


@dataclass(frozen=True)
class Canary:
    """A challenger serving ``share`` of a route's conversations until it is promoted or stopped."""

    version: int
    path: str
    share: float
    id: str           # salts the hash (``bucket``)
    started_at: str   # ISO time, UTC
    who: str = ""
    why: str = ""


@dataclass
class Live:
    """The version serving a route now, the ones before it (for rollback), and its canary if any."""

    tenant: str
    task: str
    version: int
    path: str
    history: list[dict[str, Any]] = field(default_factory=list)  # [{"version", "path"}], oldest first
    canary: Canary | None = None
    since: float = 0.0  # unix time this version went live here (0: a routes.json from before it was kept)

    def __post_init__(self) -> None:
        if isinstance(self.canary, dict):  # read back from routes.json
            self.canary = Canary(**self.canary)

    @property
    def name(self) -> str:
        return vllm_name(self.tenant, self.task, self.version)

    @property
    def canary_name(self) -> str | None:
        return None if self.canary is None else vllm_name(self.tenant, self.task, self.canary.version)

    def copy(self) -> "Live":
        return replace(self, history=[dict(h) for h in self.history])  # Canary is frozen: shared


@dataclass
class Lease:
    """One request's hold on a version: release it exactly once when the request ends."""

    tenant: str
    task: str
    version: int
    name: str
    failed: bool = False  # set by the gateway when vLLM answered with an error, or not at all
    arm: Arm | None = None  # the canary's side that served it; None when the route has no canary


class UnknownModel(KeyError):
    pass


class Router:
    def __init__(self, state_path: Path | None = None):
        self._routes: dict[tuple[str, str], Live] = {}
        self._inflight: dict[str, int] = {}
        self._ended: dict[tuple[str, str], list[int]] = {}  # (tenant, task) -> [requests, failed]
        self._pins: OrderedDict[tuple[str, str], Arm] = OrderedDict()  # (canary id, sticky key) -> side
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

    def acquire(self, tenant: str, model: str, sticky: str = "") -> Lease:
        """Hold the version that serves this request: the champion, or the canary's challenger for
        a conversation on its side (``sticky``: the conversation's key, see the module docstring)."""
        with self._cond:
            tenant, task = self.resolve(tenant, model)
            live = self._routes[(tenant, task)]
            version, name, arm = live.version, live.name, None
            if live.canary is not None:
                arm = self._side(live.canary, sticky)
                if arm == "challenger":
                    version, name = live.canary.version, live.canary_name
            self._inflight[name] = self._inflight.get(name, 0) + 1
            return Lease(tenant, task, version, name, arm=arm)

    def _side(self, canary: Canary, sticky: str) -> Arm:
        key = (canary.id, sticky)
        arm = self._pins.get(key)
        if arm is None:
            arm = "challenger" if bucket(canary.id, sticky) < canary.share else "champion"
            self._pins[key] = arm
            while len(self._pins) > MAX_PINS:
                self._pins.popitem(last=False)
        else:
            self._pins.move_to_end(key)
        return arm

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
            return None if live is None else live.copy()

    def routes(self) -> list[Live]:
        with self._cond:
            return [v.copy() for v in self._routes.values()]

    def public_models(self, tenant: str) -> list[dict[str, Any]]:
        """OpenAI model objects, one per task of ``tenant``: ``created`` is when the champion's
        version went live, ``version`` which one it is. A canary is invisible to the tenant's apps
        (each turn says which version served it)."""
        with self._cond:
            return [{"id": task, "object": "model", "created": int(live.since), "owned_by": tenant,
                     "version": label(live.version)}
                    for (t, task), live in sorted(self._routes.items()) if t == tenant]

    def flip(self, tenant: str, task: str, version: int, path: str, *, rollback: bool = False) -> Live | None:
        """Make ``version`` live in one step; return the version it replaced (or None).

        Promote pushes the old version onto the history; rollback pops it (the caller has
        taken the target from ``history[-1]``). A canary of ``version`` ends here (its challenger
        is now the champion, for every conversation); a canary of another version goes on.
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
            canary = old.canary if old is not None and old.canary and old.canary.version != int(version) else None
            self._routes[(tenant, task)] = Live(tenant, task, int(version), str(path), history[-20:], canary,
                                                time.time())
            self._save()
            return None if old is None else old.copy()

    def start_canary(self, tenant: str, task: str, canary: Canary) -> None:
        """From the next request on, ``canary.share`` of the conversations go to its version."""
        with self._cond:
            live = self._routes.get((tenant, task))
            if live is None:
                raise UnknownModel(f"{tenant}/{task}")
            live.canary = canary
            self._save()

    def set_share(self, tenant: str, task: str, share: float) -> Canary:
        """The canary's new share; conversations already served keep their side (pinned)."""
        with self._cond:
            live = self._routes.get((tenant, task))
            if live is None or live.canary is None:
                raise UnknownModel(f"{tenant}/{task} has no canary")
            live.canary = replace(live.canary, share=float(share))
            self._save()
            return live.canary

    def stop_canary(self, tenant: str, task: str) -> Canary | None:
        """Every new request goes to the champion; the canary that ran (None if none)."""
        with self._cond:
            live = self._routes.get((tenant, task))
            if live is None or live.canary is None:
                return None
            old, live.canary = live.canary, None
            for key in [k for k in self._pins if k[0] == old.id]:
                del self._pins[key]
            self._save()
            return old

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
