"""Reconcile the gateway to the registry: `champion` is what should serve, routes follow it.

Controller style. For each tenant/task, the desired adapter version is the registry's
`champion` alias and the live one is the gateway's route (`<home>/deploy/routes.json`, which
the gateway rewrites on every flip). Where they differ, one hot swap through the gateway's
reconciler-only swap route (`service.swap`), or, inside the gateway (its `/admin/deploy` and
`/admin/rollback`, and its reconcile loop), its own router and swap primitive (``GatewayHandle``:
no HTTP call back into itself); where
they agree, nothing. So it is safe to run any time, as often
as wanted: the `deployment` asset runs it after every gate and hourly, and every operator
action (pipelines/deploy/operations.py) runs it right after moving the alias. Nothing here
decides what should serve: that is the alias, moved only by the gate and by operators.

A swap that happened writes on the model versions when each served: ``tracerl.served_from``
on the new one, ``tracerl.served_until`` and ``tracerl.stopped_reason`` ("replaced by v5
(promote by gate)") on the one it replaced. The swap log (``tracerl swaps``) records who swapped
(``who``: the Dagster run, the operator, the gateway's own reconcile) and why (``swap_why``: the
registry's reason for the champion; for a gate promotion, the gate's run and decision). The
gateway down: every differing route reports "waiting for gateway" and nothing changes. A failed
swap: that route keeps its old version, the report says so, the other routes still reconcile.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal

from pipelines.adapters.version import label, tag_version
from pipelines.config import TracerlConfig

SERVED_FROM, SERVED_UNTIL, STOPPED = "tracerl.served_from", "tracerl.served_until", "tracerl.stopped_reason"

Step = Literal["in_sync", "no_champion", "wait", "swap"]
CanaryStep = Literal["none", "in_sync", "start", "stop", "replace", "wait"]
Outcome = Literal["in_sync", "no_champion", "waiting", "swapped", "failed"]
Swapper = Callable[..., dict[str, Any]]  # (tenant, task, version, who, why) -> the swap record
GATE_RUN, GATE_REASONS = "tracerl.gate.run_id", "tracerl.gate.reasons"


@dataclass
class GatewayHandle:
    """What reconcile acts on when it runs inside a gateway (each of several reconciles itself):
    its router (what it serves), its swap primitive, and its canary start/stop. Outside, reconcile
    reads routes.json and calls the running gateway's admin API instead."""

    router: Any                                                   # pipelines.deploy.routing.Router
    swap: Swapper
    start_canary: Callable[..., Any]  # (tenant, task, version, share, who, why, canary_id)
    stop_canary: Callable[[str, str, str, str], Any]               # (tenant, task, who, why)
    set_share: Callable[[str, str, float, str, str], Any]          # (tenant, task, share, who, why)


def plan(desired: int | None, live: int | None, gateway_running: bool) -> Step:
    """What to do for one route: the whole decision, pure.

    No champion: leave the route alone (the registry says nothing; never unroute on a guess).
    Equal: in sync. Different: swap, or wait while the gateway is down."""
    if desired is None:
        return "no_champion"
    if desired == live:
        return "in_sync"
    return "swap" if gateway_running else "wait"


def plan_canary(desired: int | None, live: int | None, live_ended: bool, champion: int | None,
                gateway_running: bool) -> CanaryStep:
    """The canary's half of the decision, pure. ``desired``: the adapter behind ``challenger`` with
    status ``canary``; ``live``: the route's canary; ``live_ended``: the registry records the live
    canary's version as decided (rejected, expired, stopped). A live canary the registry knows
    nothing of (an unregistered adapter) is left alone: never stop on a guess."""
    if desired is not None and desired == champion:
        desired = None  # promoted: the flip to it ended its canary
    if desired == live:
        return "none" if live is None else "in_sync"
    if desired is None and not live_ended:
        return "none"
    if not gateway_running:
        return "wait"
    return "stop" if desired is None else ("start" if live is None else "replace")


@dataclass
class TargetResult:
    """One tenant/task after reconcile. Versions are adapter-store versions (what routes name)."""

    tenant: str
    task: str
    champion: int | None          # desired: the adapter behind `champion`, None = no champion
    before: int | None            # live before, None = nothing routed (the base model)
    after: int | None             # live after
    outcome: Outcome
    reason: str = ""              # swapped: why the champion is champion; failed: the error
    swap: dict[str, Any] | None = None  # the gateway's swap record (drain, requests during it)
    canary: str = ""              # what reconcile did to the route's canary ("" = nothing to do)

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.task}"

    def line(self) -> str:
        what = {"in_sync": f"{label(self.after)} serves, in sync",
                "no_champion": f"no champion in the registry; {label(self.after)} keeps serving",
                "waiting": f"waiting for gateway to serve {label(self.champion)} ({label(self.before)} routed)",
                "swapped": f"now serving {label(self.after)} (was {label(self.before)}): {self.reason}",
                "failed": f"swap to {label(self.champion)} failed, {label(self.after)} keeps serving: {self.reason}"}
        return f"{self.key}: {what[self.outcome]}" + (f"; canary: {self.canary}" if self.canary else "")


@dataclass
class ReconcileReport:
    gateway_running: bool
    targets: list[TargetResult] = field(default_factory=list)

    def of(self, outcome: Outcome) -> list[TargetResult]:
        return [t for t in self.targets if t.outcome == outcome]

    @property
    def changed(self) -> bool:
        return bool(self.of("swapped"))

    def to_dict(self) -> dict[str, Any]:
        return {"gateway_running": self.gateway_running, "targets": [asdict(t) for t in self.targets]}

    def lines(self) -> list[str]:
        return [t.line() for t in self.targets]


def swap_why(mv: Any) -> str:
    """Why the champion ``mv`` (an MLflow model version) is served: the reason its last move
    recorded (``promote.move_champion``: "deploy by alice: hotfix", "rollback by bob: ..."); a
    gate promotion names the gate's MLflow run and its decision's first reason, e.g. "promoted by
    gate run 106f...: primary suite 'answers' (n=30, bootstrap): gain +0.3333 (champion 0.3333 ->
    candidate 0.6667), lower bound +0.2000, p_gain=0.0005 < alpha=0.0500"."""
    from pipelines.adapters.promote import REASON

    tags = mv.tags or {}
    reason = tags.get(REASON)
    if not reason:
        return f"registry version {mv.version} is the champion (set directly: no move recorded on it)"
    run = tags.get(GATE_RUN)
    if reason.startswith("promote by gate") and run:
        # the decision's first reason (the gate joins them with " | "), its figures only (to the first "; ")
        first = (tags.get(GATE_REASONS) or "").split(" | ")[0].split("; ")[0].split(", look ")[0].strip()
        detail = reason[len("promote by gate"):].lstrip(": ")
        why = f"promoted by gate run {run}" + (f" ({detail})" if detail else "")
        return why + (f": {first[:300]}" if first else "")
    return reason


def default_targets(cfg: TracerlConfig) -> list[tuple[str, str]]:
    """Every tenant/task with adapters in the store or a registered model (tags tenant, task)."""
    from pipelines.tracking import client

    root = cfg.adapter_root
    pairs = {(t.name, k.name) for t in root.glob("*") if t.is_dir() for k in t.glob("*") if k.is_dir()} \
        if root.exists() else set()
    for rm in client(cfg).search_registered_models():
        if rm.tags.get("tenant") and rm.tags.get("task"):
            pairs.add((rm.tags["tenant"], rm.tags["task"]))
    return sorted(pairs)


def reconcile(cfg: TracerlConfig, targets: list[tuple[str, str]] | None = None,
              who: str = "reconcile", gateway: GatewayHandle | None = None, canaries: bool = True) -> ReconcileReport:
    """Make the gateway serve each target's champion, and its canary unless ``canaries`` is off;
    ``who`` lands in the swap log, with why (``swap_why``). ``gateway``: the gateway this runs in
    (running by definition); without it, the running gateway of ``<home>/run/gateway.json``,
    through its admin API."""
    from pipelines.deploy.deployer import DeployError
    from pipelines.deploy.routing import Router
    from pipelines.deploy.service import GatewayError, read_gateway_state
    from pipelines.adapters.promote import REASON, alias_version
    from pipelines.adapters.registry import CHAMPION

    live_of = gateway.router.live if gateway is not None else \
        (lambda tenant, task: Router(cfg.routes_path).live(tenant, task))
    do_swap: Swapper = gateway.swap if gateway is not None else \
        (lambda tenant, task, version, by, why: _remote_swap(cfg, tenant, task, version, by, why))
    report = ReconcileReport(gateway_running=gateway is not None or read_gateway_state(cfg) is not None)
    for tenant, task in (default_targets(cfg) if targets is None else targets):
        live = live_of(tenant, task)
        before = live.version if live else None
        mv = alias_version(cfg, tenant, task, CHAMPION)
        desired = tag_version(mv) if mv is not None else None
        step = plan(desired, before, report.gateway_running)
        result = TargetResult(tenant, task, desired, before, before,
                              {"swap": "swapped", "wait": "waiting"}.get(step, step))  # type: ignore[arg-type]
        report.targets.append(result)
        if step != "swap":
            continue
        try:
            result.swap = do_swap(tenant, task, desired, who, swap_why(mv))
        except (GatewayError, DeployError, OSError) as e:  # the old version keeps serving; go on with the others
            raced = live_of(tenant, task)
            if raced is not None and raced.version == desired:  # another reconcile swapped it meanwhile
                result.after, result.outcome = desired, "in_sync"
            else:
                result.outcome, result.reason = "failed", str(e)
            continue
        now_live = live_of(tenant, task)  # the gateway wrote the flip
        result.after = now_live.version if now_live else None
        if result.after != desired:
            result.outcome, result.reason = "failed", f"the gateway answered but routes {label(result.after)}"
            continue
        result.reason = mv.tags.get(REASON) or "champion"
        _record_served(cfg, tenant, task, str(mv.version), before, desired, result.reason,
                       (result.swap or {}).get("at"))
    if canaries:
        for result in report.targets:
            if result.outcome != "failed":
                result.canary = _reconcile_canary(cfg, result.tenant, result.task, result.champion, who,
                                                  report.gateway_running, gateway)
    return report


def _remote_swap(cfg: TracerlConfig, tenant: str, task: str, version: int, who: str, why: str) -> dict[str, Any]:
    """The running gateway's swap (``service.swap``); its route takes no reason, so the why is
    noted in the swap log after it (``deployer.note_swap``), and set on the record returned."""
    from pipelines.deploy import service
    from pipelines.deploy.deployer import note_swap

    record = service.swap(cfg, tenant, task, version, who=who)
    if why and not record.get("why"):
        note_swap(cfg.routes_path.parent / "swaps.jsonl", record, why)
        record = {**record, "why": why}
    return record


def _reconcile_canary(cfg: TracerlConfig, tenant: str, task: str, champion: int | None, who: str,
                      gateway_running: bool, gateway: GatewayHandle | None = None) -> str:
    """Make the route's canary what the registry says (``plan_canary``); a line saying what was done."""
    from pipelines.adapters import promote, registry
    from pipelines.deploy.deployer import DeployError
    from pipelines.deploy.routing import Router
    from pipelines.deploy.service import GatewayError, canary

    def start(version: int, share: float, why: str, canary_id: str | None) -> None:
        if gateway is not None:
            gateway.start_canary(tenant, task, version, share, who, why, canary_id)
        else:
            canary(cfg, "start", tenant, task, version=version, share=share, who=who, why=why, canary_id=canary_id)

    def stop(why: str) -> None:
        if gateway is not None:
            gateway.stop_canary(tenant, task, who, why)
        else:
            canary(cfg, "stop", tenant, task, who=who, why=why)

    def reshare(share: float, why: str) -> None:
        if gateway is not None:
            gateway.set_share(tenant, task, share, who, why)
        else:
            canary(cfg, "share", tenant, task, share=share, who=who, why=why)

    live = (gateway.router if gateway is not None else Router(cfg.routes_path)).live(tenant, task)
    running = live.canary.version if live is not None and live.canary is not None else None
    mv = promote.canary_version(cfg, tenant, task)
    desired = tag_version(mv) if mv is not None else None
    live_mv = registry.version_for_adapter(cfg, tenant, task, running) if running is not None else None
    ended = live_mv is not None and live_mv.tags.get(promote.STATUS) != promote.CANARY
    step = plan_canary(desired, running, ended, champion, gateway_running)
    if step == "none":
        return ""
    if step == "in_sync":
        # a share set on another gateway or in the registry (its tag): every gateway runs it; with no
        # tag, each keeps the share it started at (its target's canary.share)
        share = float(mv.tags[promote.CANARY_SHARE]) if promote.CANARY_SHARE in mv.tags else None
        if share is None or live is None or live.canary is None or abs(live.canary.share - share) < 1e-9:
            return f"{label(running)} in sync"
        try:
            reshare(share, f"registry version {mv.version} runs at share {share}")
        except (GatewayError, DeployError, OSError) as e:
            return f"share failed: {e}"
        return f"{label(running)} share {live.canary.share} -> {share}"
    if step == "wait":
        return f"waiting for gateway (registry: {label(desired)}, routed: {label(running)})"
    try:
        if step in ("stop", "replace"):
            why = f"the registry says {live_mv.tags.get(promote.STATUS) if live_mv is not None else 'another version'}"
            stop(why)
        if step in ("start", "replace"):
            # the registry's share (else this target's), sent: the gateway's config may lack the entry
            start(desired, promote.canary_share(cfg, tenant, task, mv),
                  f"registry version {mv.version} is the challenger (status canary)", mv.tags.get(promote.CANARY_ID))
    except (GatewayError, DeployError, OSError) as e:
        return f"{step} failed: {e}"
    return {"stop": f"stopped {label(running)}", "start": f"started {label(desired)}",
            "replace": f"replaced {label(running)} with {label(desired)}"}[step]


def _record_served(cfg: TracerlConfig, tenant: str, task: str, registry_version: str, before: int | None,
                   after: int, reason: str, at: str | None) -> None:
    """Tags on the versions a swap touched: when the new one began serving, when and why the old stopped."""
    from pipelines.adapters import registry
    from pipelines.adapters.promote import now, set_tags
    from pipelines.tracking import client

    at = at or now()
    c, name = client(cfg), registry.model_name(tenant, task)
    set_tags(cfg, tenant, task, registry_version, {SERVED_FROM: at})
    current = c.get_model_version(name, registry_version).tags
    for stale in (SERVED_UNTIL, STOPPED):  # serving again: the last stint's end is history now
        if stale in current:
            c.delete_model_version_tag(name, registry_version, stale)
    old = registry.version_for_adapter(cfg, tenant, task, before) if before is not None else None
    if old is not None and str(old.version) != registry_version:
        set_tags(cfg, tenant, task, old.version, {SERVED_UNTIL: at, STOPPED: f"replaced by v{after} ({reason})"})
