"""Promote and roll back adapter versions with zero failed requests, and log every swap.

Promote ``(tenant, task, v)``:
  1. validate the adapter (inside the store, READY, safetensors only, base model hash equal);
  2. load it into every vLLM upstream under its own versioned name (``tenant/task/v<N>``, a
     new name and folder per version, so no in-place reload and no stale prefix cache);
  3. flip the router: new requests get v, requests in flight keep the old version;
  4. wait until the old version has no request in flight (``drain_timeout_s``), then unload it.
Rollback: the same toward the version live before (``Live.history``), reloaded from the store.
Restore (a restarted gateway or vLLM): 1-2 for every route, each on its own, so an adapter
changed on disk since its deploy is refused there too, without keeping the others down.
A failure in 1-2 raises :class:`DeployError` and changes nothing: the old version keeps serving.
Loads are serialized by one lock (concurrent loads race in vLLM 0.32).

Every attempt, failed or not, is one JSON line in ``<home>/deploy/swaps.jsonl``:
``{at, who, action, tenant, task, from, to, ok, error, load_s, drain_s, drained, unloaded,
requests, failed_requests}``; the last two count the route's requests that ended between the
start of the load and the end of the drain, and those of them vLLM failed (the zero-failure
claim, measured on live traffic by the router).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from pipelines.deploy import admin
from pipelines.deploy.routing import Router, vllm_name
from pipelines.adapters.store import META, READY, AdapterStore, AdapterVersion
from pipelines.adapters.version import label

UNSAFE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt")  # pickle = code execution


class DeployError(RuntimeError):
    pass


def validate_adapter(store: AdapterStore, tenant: str, task: str, version: int, base_hash: str) -> AdapterVersion:
    """The published adapter, or a :class:`DeployError` that says what is wrong and the fix."""
    try:
        av = store.get(tenant, task, int(version))
    except (KeyError, ValueError) as err:
        raise DeployError(f"{tenant}/{task}/v{version}: {err}") from None
    where = f"{tenant}/{task}/v{version} ({av.path})"
    real = av.path.resolve()
    if not real.is_relative_to(store.root):
        raise DeployError(f"{where} resolves to {real}, outside the adapter store {store.root}; "
                          f"publish adapters with AdapterStore.publish")
    for child in real.rglob("*"):
        if child.is_symlink() and not child.resolve().is_relative_to(store.root):
            raise DeployError(f"{where}: {child.name} links outside the adapter store")
    unsafe = sorted(p.name for pattern in UNSAFE_WEIGHTS for p in real.rglob(pattern))
    if unsafe:
        raise DeployError(f"{where} holds {unsafe}: only safetensors weights are deployed "
                          f"(save with safe_serialization=True)")
    for name in ("adapter_config.json", "adapter_model.safetensors", META, READY):
        if not (real / name).is_file():
            raise DeployError(f"{where} lacks {name}")
    try:  # the header and its offsets cover the file exactly: a torn or foreign file fails here, not in vLLM
        with safe_open(str(real / "adapter_model.safetensors"), framework="numpy") as fh:
            fh.keys()
    except SafetensorError as err:
        raise DeployError(f"{where}: adapter_model.safetensors is not a valid safetensors file ({err}); "
                          f"republish the adapter") from None
    got = av.meta.get("base_model_hash")
    if got != base_hash:
        raise DeployError(f"{where} was trained on base model {str(got)[:12]}..., but vLLM serves "
                          f"{base_hash[:12]}...; retrain on the served base or serve its base")
    return av


class Deployer:
    def __init__(self, router: Router, upstreams: list[str], store: AdapterStore, base_hash: str,
                 swaps_path: Path, drain_timeout_s: float = 120.0):
        self.router, self.upstreams, self.store = router, list(upstreams), store
        self.base_hash, self.swaps_path = base_hash, Path(swaps_path)
        self.drain_timeout_s = drain_timeout_s
        self._lock = threading.Lock()

    # -- public -------------------------------------------------------------------------------

    def promote(self, tenant: str, task: str, version: int, who: str) -> dict[str, Any]:
        return self._swap("deploy", tenant, task, int(version), who)

    def rollback(self, tenant: str, task: str, who: str) -> dict[str, Any]:
        return self._swap("rollback", tenant, task, None, who)

    def restore(self, who: str = "restore") -> list[dict[str, Any]]:
        """Load every routed version into the upstreams (a restarted gateway or vLLM), validated
        as a deploy is; one record per route, also in swaps.jsonl.

        A refused route is reported (``ok: false`` and the reason) and left routed but not
        loaded: its requests fail until it is fixed (re-publish and deploy, or roll back);
        every other route restores. Loading from the store's path, not the one routes.json
        recorded, so a rewritten routes.json cannot point vLLM at another folder.
        """
        records = []
        with self._lock:
            for live in self.router.routes():
                record: dict[str, Any] = {"at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                                          "who": who, "action": "restore", "tenant": live.tenant,
                                          "task": live.task, "from": None, "to": label(live.version)}
                t0 = time.monotonic()
                try:
                    av = validate_adapter(self.store, live.tenant, live.task, live.version, self.base_hash)
                    self._load(live.name, av.path)
                    record.update(ok=True, load_s=round(time.monotonic() - t0, 3))
                except Exception as err:  # noqa: BLE001 - one bad route must not keep the others down
                    record.update(ok=False, error=f"{type(err).__name__}: {err}")
                self._log(record)
                records.append(record)
        return records

    # -- the swap -----------------------------------------------------------------------------

    def _swap(self, action: str, tenant: str, task: str, version: int | None, who: str) -> dict[str, Any]:
        with self._lock:
            record: dict[str, Any] = {"at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                                      "who": who, "action": action, "tenant": tenant, "task": task}
            t0, ended0 = time.monotonic(), self.router.ended(tenant, task)
            try:
                old = self.router.live(tenant, task)
                record["from"] = label(old.version) if old else None
                if action == "rollback":
                    if old is None or not old.history:
                        raise DeployError(f"{tenant}/{task} has no previous version to roll back to")
                    version = int(old.history[-1]["version"])
                record["to"] = label(version)
                if old is not None and old.version == version:
                    raise DeployError(f"{tenant}/{task} v{version} is already live")
                av = validate_adapter(self.store, tenant, task, version, self.base_hash)
                name = vllm_name(tenant, task, version)
                self._load(name, av.path)
                record["load_s"] = round(time.monotonic() - t0, 3)
                self.router.flip(tenant, task, version, str(av.path), rollback=action == "rollback")
            except Exception as err:
                record.update(ok=False, error=f"{type(err).__name__}: {err}")
                self._log(record)
                if isinstance(err, DeployError):
                    raise
                raise DeployError(f"{action} {tenant}/{task} to {record.get('to')} failed; "
                                  f"{record.get('from')} keeps serving: {err}") from err
            record["ok"] = True
            if old is not None:  # drain, then unload the version nobody gets any more
                t1 = time.monotonic()
                record["drained"] = self.router.wait_drained(old.name, self.drain_timeout_s)
                record["drain_s"] = round(time.monotonic() - t1, 3)
                if record["drained"]:
                    record["unloaded"] = self._unload(old.name)
            ended1 = self.router.ended(tenant, task)
            record["requests"], record["failed_requests"] = ended1[0] - ended0[0], ended1[1] - ended0[1]
            self._log(record)
            return record

    def _load(self, name: str, path: Path) -> None:
        """Load on every upstream; on a failure undo the ones that succeeded and raise."""
        done: list[str] = []
        for url in self.upstreams:
            try:
                admin.load_adapter(url, name, path)
            except admin.VllmAdminError as err:
                if err.status == 400 and "already" in err.message:
                    continue  # loaded before (restore, or a reload of a rolled-back name)
                for other in done:
                    self._unload_one(other, name)
                raise DeployError(f"vLLM at {url} refused adapter {name} from {path}: {err.message}") from None
            done.append(url)

    def _unload(self, name: str) -> bool:
        return all([self._unload_one(url, name) for url in self.upstreams])

    @staticmethod
    def _unload_one(url: str, name: str) -> bool:
        try:
            admin.unload_adapter(url, name)
            return True
        except admin.VllmAdminError:
            return False

    def _log(self, record: dict[str, Any]) -> None:
        self.swaps_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.swaps_path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()


def read_swaps(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Swap records, oldest first (the last ``limit`` when given)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[-limit:] if limit else rows
