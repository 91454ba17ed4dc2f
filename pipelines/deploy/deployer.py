"""Promote and roll back adapter versions with zero failed requests, and log every swap.

Promote ``(tenant, task, v)``:
  1. validate the adapter (inside the store, READY, safetensors only, base model hash equal);
  2. load it into every vLLM upstream under its own versioned name (``tenant/task/v<N>``, a
     new name and folder per version, so no in-place reload and no stale prefix cache);
  3. flip the router: new requests get v, requests in flight keep the old version;
  4. wait until the old version has no request in flight (``drain_timeout_s``), then unload it.
Rollback: the same toward the version live before (``Live.history``), reloaded from the store.
Canary (issue #15): start = 1-2 for the challenger, then the router sends its share of the
conversations to it; stop = the router sends everything to the champion, then 4 for the
challenger; promote of the challenger = a swap whose load finds it loaded already.
Restore (a restarted gateway or vLLM): 1-2 for every route, each on its own, so an adapter
changed on disk since its deploy is refused there too, without keeping the others down.
A failure in 1-2 raises :class:`DeployError` and changes nothing: the old version keeps serving.
Loads are serialized by one lock (concurrent loads race in vLLM 0.32).
Several replicas (``upstreams.py``): loads and unloads go to the replicas serving; one that is
out gets the routed adapters when it answers again (``restore_replica``), before it is put back.
Several gateways on one home (``peers.py``): a name another gateway routes or holds is never
unloaded (the last one to drain it does), and loads are serialized across them. ``sweep`` unloads
what no gateway uses any more (two drains at once, a drain that timed out, once its requests end).

Every attempt, failed or not, is one JSON line in ``<home>/deploy/swaps.jsonl``:
``{at, who, why, action, tenant, task, from, to, ok, error, load_s, drain_s, drained, unloaded,
requests, failed_requests}``; the last two count the route's requests that ended between the
start of the load and the end of the drain, and those of them vLLM failed (the zero-failure
claim, measured on live traffic by the router). ``who`` did it and ``why``: reconcile passes the
registry's reason for the champion (the gate's run and decision, an operator's --why); a swap
asked for over the gateway's swap route, which carries no reason, gets its ``why`` from a note
line the reconciler appends after it (``note_swap``), merged in by ``read_swaps``.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from contextlib import nullcontext
from typing import Any

from safetensors import SafetensorError, safe_open

from pipelines.deploy import admin
from pipelines.deploy.routing import Canary, Router, vllm_name
from pipelines.deploy.peers import Holds, held_by_others, load_lock
from pipelines.deploy.upstreams import Upstreams
from pipelines.adapters.store import META, READY, AdapterStore, AdapterVersion
from pipelines.adapters.version import label

ROUTE_NAME = re.compile(r"^[^/]+/[^/]+/v\d+$")  # what the deployer loads (lora_name); the gate's differ
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
    def __init__(self, router: Router, upstreams: Upstreams | list[str], store: AdapterStore, base_hash: str,
                 swaps_path: Path, drain_timeout_s: float = 120.0, base_root: str | None = None,
                 home: Path | None = None):
        """``swaps_path``'s folder is this gateway's deploy dir (its holds too); ``home``: where the
        other gateways sharing the replicas keep theirs (None: a gateway alone)."""
        self.router, self.store = router, store
        self.upstreams = upstreams if isinstance(upstreams, Upstreams) else Upstreams(upstreams)
        self.base_hash, self.swaps_path, self.base_root = base_hash, Path(swaps_path), base_root
        self.home, self.holds = home, Holds(self.swaps_path.parent)
        self.drain_timeout_s = drain_timeout_s
        self._lock = threading.Lock()

    # -- public -------------------------------------------------------------------------------

    def promote(self, tenant: str, task: str, version: int, who: str, why: str = "") -> dict[str, Any]:
        return self._swap("deploy", tenant, task, int(version), who, why)

    def rollback(self, tenant: str, task: str, who: str, why: str = "") -> dict[str, Any]:
        return self._swap("rollback", tenant, task, None, who, why)

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
                record = self._record(who, "restore", live.tenant, live.task, to=label(live.version),
                                      why="the gateway or vLLM (re)started: the routed version is loaded again")
                record["from"] = None
                t0 = time.monotonic()
                try:
                    av = validate_adapter(self.store, live.tenant, live.task, live.version, self.base_hash)
                    self._load(live.name, av.path)
                    record.update(ok=True, load_s=round(time.monotonic() - t0, 3))
                except Exception as err:  # noqa: BLE001 - one bad route must not keep the others down
                    record.update(ok=False, error=f"{type(err).__name__}: {err}")
                if live.canary is not None:
                    record["canary"] = self._restore_canary(live)
                self._log(record)
                records.append(record)
        return records

    def _restore_canary(self, live) -> dict[str, Any]:
        """Load the challenger again; one that no longer validates is stopped (its conversations
        go to the champion) rather than left to fail its requests."""
        c = live.canary
        try:
            av = validate_adapter(self.store, live.tenant, live.task, c.version, self.base_hash)
            self._load(live.canary_name, av.path)
            return {"version": label(c.version), "share": c.share, "ok": True}
        except Exception as err:  # noqa: BLE001
            self.router.stop_canary(live.tenant, live.task)
            return {"version": label(c.version), "share": c.share, "ok": False, "stopped": True,
                    "error": f"{type(err).__name__}: {err}"}

    def restore_replica(self, url: str, who: str = "health") -> dict[str, Any]:
        """Make the replica at ``url`` hold exactly the routed adapters (champions and canaries),
        then put it back in the round-robin; one record in swaps.jsonl. A replica serving another
        base, or refusing a load, raises (DeployError) and stays out; a route whose adapter no
        longer validates is skipped, as ``restore`` leaves it (it fails on every replica alike)."""
        with self._lock:
            record = {"at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "who": who,
                      "why": f"replica {url} answers again: it gets the routed adapters before it serves",
                      "action": "replica_back", "replica": url, "loaded": [], "unloaded": [], "skipped": []}
            t0 = time.monotonic()
            try:
                models = admin.list_models(url)
                roots = {m.get("root") for m in models if m.get("parent") is None}
                if self.base_root is not None and roots != {self.base_root}:
                    raise DeployError(f"vLLM at {url} serves {sorted(map(str, roots))}, not {self.base_root}")
                want = self._wanted()
                loaded = {m["id"] for m in models if m.get("parent") is not None}
                for name, (tenant, task, version) in sorted(want.items()):
                    if name in loaded:
                        continue
                    try:
                        av = validate_adapter(self.store, tenant, task, version, self.base_hash)
                    except DeployError as err:
                        record["skipped"].append(f"{name}: {err}")
                        continue
                    try:
                        with self._load_lock():
                            admin.load_adapter(url, name, av.path)
                    except admin.VllmAdminError as err:
                        if not (err.status == 400 and "already" in err.message):
                            raise DeployError(f"vLLM at {url} refused adapter {name}: {err.message}") from None
                    record["loaded"].append(name)
                stale = {n for n in loaded - set(want) - self._others() if ROUTE_NAME.match(n)}
                for name in sorted(stale):  # unloaded elsewhere while this one was out
                    if self._unload_one(url, name):
                        record["unloaded"].append(name)
                self.upstreams.mark_up(url)
            except Exception as err:
                record.update(ok=False, error=f"{type(err).__name__}: {err}")
                self._log(record)
                raise err if isinstance(err, DeployError) else DeployError(str(err)) from err
            record.update(ok=True, load_s=round(time.monotonic() - t0, 3))
            self._log(record)
            return record

    def sweep(self, who: str = "sweep") -> dict[str, Any] | None:
        """Unload from the replicas the deployer's names (``tenant/task/vN``) nobody uses: not routed
        here, held by no gateway, no request of this gateway on them. Two gateways draining one name
        at once leave it loaded (each saw the other's hold), and a drain that timed out keeps its hold
        until its requests end; this releases such holds and unloads what is left. One swaps.jsonl
        record when it changed anything, else None. The gateway runs it every ``sweep_interval_s``."""
        with self._lock:
            wanted = set(self._wanted())
            released = sorted(n for n in self.holds.names() - wanted if self.router.inflight(n) == 0)
            for name in released:
                self.holds.discard(name)
            keep = wanted | self.holds.names()
            loaded: dict[str, set[str]] = {}
            for url in self.upstreams.serving():
                try:
                    loaded[url] = {m["id"] for m in admin.list_models(url)
                                   if m.get("parent") is not None and ROUTE_NAME.match(m["id"])}
                except admin.VllmAdminError:
                    continue  # a replica going down: the probes take it out, its restore unloads the rest
            others = self._others()  # read after listing: a peer's hold, written before its load, protects it
            unloaded = [f"{name} from {url}" for url, names in loaded.items()
                        for name in sorted(names - keep - others)
                        if self.router.inflight(name) == 0 and self._unload_one(url, name)]
            if not (released or unloaded):
                return None
            record = {"at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "who": who,
                      "why": "adapters no gateway routes or holds any more", "action": "sweep", "ok": True,
                      "released": released, "unloaded": unloaded}
            self._log(record)
            return record

    def _wanted(self) -> dict[str, tuple[str, str, int]]:
        """The names this gateway routes (champions and canaries): name -> (tenant, task, version)."""
        want: dict[str, tuple[str, str, int]] = {}
        for live in self.router.routes():
            want[live.name] = (live.tenant, live.task, live.version)
            if live.canary is not None:
                want[str(live.canary_name)] = (live.tenant, live.task, live.canary.version)
        return want

    # -- the canary ---------------------------------------------------------------------------

    def start_canary(self, tenant: str, task: str, version: int, share: float, who: str,
                     why: str = "", canary_id: str | None = None) -> dict[str, Any]:
        """Load ``version`` and send ``share`` of the route's conversations to it. Refused (DeployError,
        nothing changes) for an unrouted task, the champion itself, a second canary, or an adapter
        that does not validate. ``canary_id``: the registry's (every gateway alike); None draws one."""
        version = int(version)
        with self._lock:
            record = self._record(who, "canary_start", tenant, task, to=label(version), share=float(share), why=why)
            t0 = time.monotonic()
            try:
                live = self.router.live(tenant, task)
                if live is None:
                    raise DeployError(f"{tenant}/{task} serves no champion: deploy one before a canary")
                record["from"] = label(live.version)
                if not 0.0 < share < 1.0:
                    raise DeployError(f"share={share!r} must be in (0, 1): the challenger's share of conversations")
                if live.version == version:
                    raise DeployError(f"{tenant}/{task} v{version} is the champion; a canary tries another version")
                if live.canary is not None:
                    raise DeployError(f"{tenant}/{task} already runs a canary of {label(live.canary.version)} "
                                      f"(share {live.canary.share}); stop it first, or change its share")
                av = validate_adapter(self.store, tenant, task, version, self.base_hash)
                name = vllm_name(tenant, task, version)
                self.holds.add(name)  # from before the load until the route names it
                try:
                    self._load(name, av.path)
                    record["load_s"] = round(time.monotonic() - t0, 3)
                    canary = Canary(version, str(av.path), float(share), canary_id or uuid.uuid4().hex,
                                    record["at"], who, why)
                    self.router.start_canary(tenant, task, canary)
                finally:
                    self.holds.discard(name)
            except Exception as err:
                raise self._refused(record, err)
            record.update(ok=True, canary_id=canary.id)
            self._log(record)
            return record

    def set_share(self, tenant: str, task: str, share: float, who: str, why: str = "") -> dict[str, Any]:
        """A running canary's share, from the next new conversation on."""
        with self._lock:
            record = self._record(who, "canary_share", tenant, task, share=float(share), why=why)
            try:
                if not 0.0 < share < 1.0:
                    raise DeployError(f"share={share!r} must be in (0, 1); to end the canary, stop it")
                live = self.router.live(tenant, task)
                if live is None or live.canary is None:
                    raise DeployError(f"{tenant}/{task} runs no canary")
                record.update({"from": live.canary.share, "to": label(live.canary.version)})
                self.router.set_share(tenant, task, share)
            except Exception as err:
                raise self._refused(record, err)
            record["ok"] = True
            self._log(record)
            return record

    def stop_canary(self, tenant: str, task: str, who: str, why: str = "") -> dict[str, Any]:
        """Every new request to the champion; the challenger's requests finish, then it is unloaded."""
        with self._lock:
            record = self._record(who, "canary_stop", tenant, task, why=why)
            ended0 = self.router.ended(tenant, task)
            live = self.router.live(tenant, task)
            if live is not None and live.canary is not None:
                self.holds.add(str(live.canary_name))  # until drained: another gateway must not unload it
            old = self.router.stop_canary(tenant, task)
            if live is None or old is None:
                raise self._refused(record, DeployError(f"{tenant}/{task} runs no canary"))
            name = vllm_name(tenant, task, old.version)
            record.update({"from": label(old.version), "to": label(live.version), "share": old.share, "ok": True})
            t1 = time.monotonic()
            record["drained"] = self.router.wait_drained(name, self.drain_timeout_s)
            record["drain_s"] = round(time.monotonic() - t1, 3)
            if record["drained"]:  # else held until its requests end: ``sweep`` releases and unloads it
                record["unloaded"] = self._unload(name)
                self.holds.discard(name)
            ended1 = self.router.ended(tenant, task)
            record["requests"], record["failed_requests"] = ended1[0] - ended0[0], ended1[1] - ended0[1]
            self._log(record)
            return record

    @staticmethod
    def _record(who: str, action: str, tenant: str, task: str, **fields: Any) -> dict[str, Any]:
        return {"at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "who": who,
                "action": action, "tenant": tenant, "task": task, **{k: v for k, v in fields.items() if v != ""}}

    def _refused(self, record: dict[str, Any], err: Exception) -> DeployError:
        """Log the failed attempt; the DeployError to raise (nothing changed)."""
        record.update(ok=False, error=f"{type(err).__name__}: {err}")
        self._log(record)
        return err if isinstance(err, DeployError) else \
            DeployError(f"{record['action']} {record['tenant']}/{record['task']} failed: {err}")

    # -- the swap -----------------------------------------------------------------------------

    def _swap(self, action: str, tenant: str, task: str, version: int | None, who: str,
              why: str = "") -> dict[str, Any]:
        with self._lock:
            record = self._record(who, action, tenant, task, why=why)
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
                self.holds.add(name)  # from before the load until the route names it
                if old is not None:
                    self.holds.add(old.name)  # from before the flip until it is drained
                try:
                    self._load(name, av.path)
                    record["load_s"] = round(time.monotonic() - t0, 3)
                    self.router.flip(tenant, task, version, str(av.path), rollback=action == "rollback")
                finally:
                    self.holds.discard(name)
            except Exception as err:
                if old is not None:
                    self.holds.discard(old.name)
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
                if record["drained"]:  # else held until its requests end: ``sweep`` releases and unloads it
                    record["unloaded"] = self._unload(old.name)
                    self.holds.discard(old.name)
            ended1 = self.router.ended(tenant, task)
            record["requests"], record["failed_requests"] = ended1[0] - ended0[0], ended1[1] - ended0[1]
            self._log(record)
            return record

    def _load(self, name: str, path: Path) -> None:
        """Load on every replica serving; on a failure undo the ones that succeeded and raise. A
        replica that is out gets it when it comes back (``restore_replica``)."""
        done: list[str] = []
        serving = self.upstreams.serving()
        if not serving:
            raise DeployError(f"no vLLM replica is serving (of {len(self.upstreams.urls)}): cannot load {name}")
        for url in serving:
            try:
                with self._load_lock():
                    admin.load_adapter(url, name, path)
            except admin.VllmAdminError as err:
                if err.status == 400 and "already" in err.message:
                    continue  # loaded before (restore, a rolled-back name, another gateway)
                if name not in self._others():
                    for other in done:
                        self._unload_one(other, name)
                raise DeployError(f"vLLM at {url} refused adapter {name} from {path}: {err.message}") from None
            done.append(url)

    def _load_lock(self):
        return load_lock(self.home) if self.home is not None else nullcontext()

    def _others(self) -> set[str]:
        """The names the other gateways on this home route or hold (none for a gateway alone)."""
        return held_by_others(self.home, self.swaps_path.parent) if self.home is not None else set()

    def _unload(self, name: str) -> bool:
        """Unload from every replica serving; False, and nothing unloaded, while another gateway
        routes or holds the name (it unloads it when it drains it)."""
        if name in self._others():
            return False
        return all([self._unload_one(url, name) for url in self.upstreams.serving()])

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


NOTE = "note_of"  # a line of swaps.jsonl that gives a record (its tenant, task and `at`) the why it lacks


def note_swap(path: Path, record: dict[str, Any], why: str) -> None:
    """Append to the swap log at ``path`` the ``why`` of a swap a gateway logged without one (its
    swap route takes none): ``read_swaps`` sets it on ``record``'s line. One line, appended whole,
    like the gateway's own."""
    if not why or not record.get("at"):
        return
    line = {NOTE: record["at"], "tenant": record.get("tenant"), "task": record.get("task"), "why": why}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(json.dumps(line) + "\n")


def read_swaps(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Swap records, oldest first (the last ``limit`` when given), each with the why a note gave it."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    notes = {(n.get("tenant"), n.get("task"), n[NOTE]): n.get("why") for n in lines if NOTE in n}
    rows = [r for r in lines if NOTE not in r]
    for r in rows:
        why = notes.get((r.get("tenant"), r.get("task"), r.get("at")))
        if why and not r.get("why"):
            r["why"] = why
    return rows[-limit:] if limit else rows

