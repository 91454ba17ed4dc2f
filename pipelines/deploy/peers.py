"""Several gateways on one home share the vLLM replicas: which adapter names each one holds.

Each gateway keeps its own router (``routes.json`` in its deploy dir, ``service.gateway_dirs``),
and beside it ``holds.json``: the names it holds beyond its routes, from just before it loads one
until it has drained one it stopped routing. A version one gateway drained may still serve
another's requests, so a name is unloaded from the replicas only when no other gateway holds it
(``held_by_others``); the gateway that drains it last unloads it, and ``Deployer.sweep`` unloads
what a race left loaded (two gateways draining one name at once) and releases a hold whose drain
timed out once its requests have ended. Holds are written before a load and read after listing what a replica
has loaded, so a sweep never unloads a name a peer is about to route.

Loads into a replica are serialized across the gateways by ``load_lock`` (concurrent loads race
in vLLM 0.32, docs/measured.md). Both are files under ``<home>``: the gateways must share it, on
one host (``flock``), as the replicas already share the adapter store's paths. A gateway retired
for good leaves its holds behind: remove ``<home>/gateways/<instance>``, or its names stay loaded.
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import AbstractContextManager
from pathlib import Path

HOLDS = "holds.json"


def deploy_dirs(home: Path) -> list[Path]:
    """The deploy dir of every gateway that ran on ``home``: the single one's, then each instance's."""
    home = Path(home)
    return [home / "deploy", *sorted((home / "gateways").glob("*/deploy"))]


def held(deploy_dir: Path) -> set[str]:
    """The names the gateway whose deploy dir this is serves (routes, canaries) or holds."""
    from pipelines.deploy.routing import Router

    names: set[str] = set()
    try:
        for live in Router(deploy_dir / "routes.json").routes():
            names.add(live.name)
            if live.canary_name:
                names.add(live.canary_name)
    except (OSError, ValueError, TypeError):  # a routes.json being replaced, or from another release
        pass
    try:
        names |= set(json.loads((deploy_dir / HOLDS).read_text()))
    except (OSError, ValueError, TypeError):
        pass
    return names


def held_by_others(home: Path, own: Path) -> set[str]:
    return set().union(*(held(d) for d in deploy_dirs(home) if d.resolve() != Path(own).resolve()))


class Holds:
    """This gateway's ``holds.json``: names it has loaded or is draining outside its routes."""

    def __init__(self, deploy_dir: Path):
        self.path = Path(deploy_dir) / HOLDS
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def names(self) -> set[str]:
        with self._lock:
            return set(self._names)

    def add(self, name: str) -> None:
        with self._lock:
            self._names.add(name)
            self._save()

    def discard(self, name: str) -> None:
        with self._lock:
            self._names.discard(name)
            self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(sorted(self._names)))
        os.replace(tmp, self.path)


def load_lock(home: Path) -> AbstractContextManager[None]:
    """One load into the replicas at a time across every gateway on ``home`` (``<home>/gateways/load.lock``)."""
    from pipelines.services.process import lock

    return lock(Path(home) / "gateways", "load")
