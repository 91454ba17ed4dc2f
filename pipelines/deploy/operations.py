"""Operator actions: move the registry's `champion` alias with who and why, then reconcile.

`champion` is what should serve; these are the only ways a person moves it (the gate moves it
too, pipelines/adapters/promote.py), and each reconciles the gateway at once, so the route follows
within the command. The gateway's `/admin/deploy` and `/admin/rollback` are `deploy` and
`rollback` here too (with the gateway itself as ``gateway``: its router and swap primitive). Nothing automatic
undoes them: the `deployment` asset reconciles to the same alias, and a rolled-back version is
never promoted again except by `deploy` here.

Versions are adapter-store versions (what `tracerl adapters` lists and routes name: v3); the
registry version behind each is looked up by its `adapter_version` tag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.config import TracerlConfig
from pipelines.deploy.reconcile import GatewayHandle, ReconcileReport, TargetResult, reconcile


class Refused(RuntimeError):
    """The registry's record forbids the action (a gate-rejected version without --force)."""


class NotRegistered(LookupError):
    """The adapter version has no model version in the registry."""


@dataclass
class ActionResult:
    """What an operator action did to the registry, and what reconcile then did to the gateway."""

    action: str
    tenant: str
    task: str
    registry: dict[str, Any]       # the alias move (champion, previous, reason) or rejection
    serving: TargetResult          # the route after reconcile
    gateway_running: bool

    @property
    def ok(self) -> bool:
        """The gateway serves what the registry says (or will, once the gateway runs)."""
        return self.serving.outcome != "failed"

    def summary(self) -> str:
        note = "" if self.gateway_running else " (the gateway is not running: the next `deployment` run " \
                                                 "or operator action serves the champion once it is)"
        return self.serving.line() + note

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"action": self.action, "registry": self.registry, "serving": asdict(self.serving),
                "gateway_running": self.gateway_running, "summary": self.summary()}


def _why(why: str, action: str) -> str:
    why = (why or "").strip()
    if not why:
        raise ValueError(f"{action}: --why is empty; say why (e.g. --why 'latency regression'): it is "
                         f"recorded on the model versions with --who")
    return why


def _version(cfg: TracerlConfig, tenant: str, task: str, adapter_version: int) -> Any:
    from pipelines.adapters import registry

    mv = registry.version_for_adapter(cfg, tenant, task, adapter_version)
    if mv is None:
        raise NotRegistered(f"{tenant}/{task} adapter v{adapter_version} is not registered in MLflow "
                          f"(model {registry.model_name(tenant, task)}); `tracerl adapters --tenant {tenant} "
                          f"--task {task}` lists the adapter versions")
    return mv


def _settle(cfg: TracerlConfig, action: str, tenant: str, task: str, registry: dict[str, Any],
            who: str, gateway: GatewayHandle | None = None) -> ActionResult:
    # inside a gateway its admin API moves canaries itself: the champion only
    report: ReconcileReport = reconcile(cfg, [(tenant, task)], who=who, gateway=gateway, canaries=gateway is None)
    return ActionResult(action, tenant, task, registry, report.targets[0], report.gateway_running)


def rollback(cfg: TracerlConfig, tenant: str, task: str, who: str, why: str,
             gateway: GatewayHandle | None = None) -> ActionResult:
    """`champion` back to the version it replaced; the current one is marked rolled back."""
    from pipelines.adapters import promote

    done = promote.rollback(cfg, tenant, task, who=who, why=_why(why, "rollback"))
    return _settle(cfg, "rollback", tenant, task, done, who, gateway)


def deploy(cfg: TracerlConfig, tenant: str, task: str, adapter_version: int, who: str, why: str,
           force: bool = False, gateway: GatewayHandle | None = None) -> ActionResult:
    """`champion` to adapter ``adapter_version``. Refused (``Refused``) for a version the gate
    rejected (reject, contaminated) or a reviewer rejected, unless ``force``: then recorded as a
    forced override with who and why. A version never gated is deployed (the operator's call)."""
    from pipelines.adapters import promote
    from pipelines.adapters.registry import CHAMPION

    why = _why(why, "deploy")
    mv = _version(cfg, tenant, task, adapter_version)
    decision = mv.tags.get(promote.DECISION)
    reasons = mv.tags.get("tracerl.gate.reasons", "")
    if "tracerl.gate.contamination" in mv.tags:
        verdict = f"the gate decided contaminated (trained on private eval items): {reasons}"
    elif decision == "reject":
        verdict = f"the gate decided reject: {reasons or 'no reasons recorded'}"
    elif mv.tags.get(promote.STATUS) == promote.REJECTED:
        verdict = (f"rejected in review by {mv.tags.get('tracerl.rejected_by', '?')}: "
                   f"{mv.tags.get('tracerl.rejected_why', '')}")
    else:
        verdict = ""
    rejected = bool(verdict)
    if rejected and not force:
        raise Refused(f"{tenant}/{task} v{adapter_version} (registry version {mv.version}): {verdict}. Not "
                      f"deployed; to serve it anyway, add --force (recorded as a forced override with --who "
                      f"and --why)")
    current = promote.alias_version(cfg, tenant, task, CHAMPION)
    if current is not None and str(current.version) == str(mv.version):
        done = {"model": f"{tenant}.{task}", "champion": str(mv.version), "adapter_version": int(adapter_version),
                "note": "already the champion; reconciled the route only"}
    else:
        extra = {"tracerl.forced_override": f"by {who}: {why} (over: {verdict})"[:5000]} if rejected else {}
        action = "forced deploy" if rejected else "deploy"
        done = promote.move_champion(cfg, tenant, task, str(mv.version), action=action, who=who, why=why,
                                     extra_tags=extra)
        done["gate_decision"] = decision or "none (never gated)"
    return _settle(cfg, "deploy", tenant, task, done, who, gateway)


def approve(cfg: TracerlConfig, tenant: str, task: str, adapter_version: int, who: str, why: str) -> ActionResult:
    """A held challenger (review mode) becomes champion and serves."""
    from pipelines.adapters import promote

    mv = _version(cfg, tenant, task, adapter_version)
    done = promote.approve(cfg, tenant, task, str(mv.version), who, _why(why, "approve"))
    return _settle(cfg, "approve", tenant, task, done, who)


def reject(cfg: TracerlConfig, tenant: str, task: str, adapter_version: int, who: str, why: str) -> ActionResult:
    """A held challenger is rejected: status rejected, `challenger` dropped; the champion stays."""
    from pipelines.adapters import promote

    mv = _version(cfg, tenant, task, adapter_version)
    done = promote.reject_held(cfg, tenant, task, str(mv.version), who, _why(why, "reject"))
    return _settle(cfg, "reject", tenant, task, done, who)


def approve_tagged(cfg: TracerlConfig, approval_tag: str) -> list[ActionResult]:
    """Approve every held version a reviewer tagged in the MLflow UI (``approval_tag`` = true),
    oldest first, then reconcile each tenant/task once (the newest approved ends up serving)."""
    from pipelines.adapters import promote

    pending = promote.all_pending_approvals(cfg, approval_tag)
    done: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for tenant, task, _ in pending:
        if (tenant, task) not in done:
            done[(tenant, task)] = promote.promote_approved(cfg, tenant, task, approval_tag)
    return [_settle(cfg, "approve", tenant, task, {"approved": moves}, "mlflow-ui")
            for (tenant, task), moves in sorted(done.items())]


def record_canary(cfg: TracerlConfig, tenant: str, task: str, adapter_version: int, started: bool,
                  who: str, why: str, canary_id: str | None = None, share: float | None = None) -> str:
    """Write a canary the gateway's admin API just started or stopped into the registry, which
    every other path reads as the truth (``challenger`` with status ``canary``): the reconciler
    then keeps the gateway that way. Never fails the gateway action: an unregistered adapter or an
    unreachable registry comes back as a note (the canary step records it on its next run)."""
    from pipelines.adapters import promote, registry

    try:
        mv = registry.version_for_adapter(cfg, tenant, task, int(adapter_version))
        if mv is None:
            return f"adapter v{adapter_version} is not registered: the registry is unchanged"
        if started:
            promote.enter_canary(cfg, tenant, task, str(mv.version), who, why, canary_id, share)
            return f"registry version {mv.version} is the challenger (status canary)"
        if mv.tags.get(promote.STATUS) == promote.CANARY:
            promote.end_canary(cfg, tenant, task, str(mv.version), promote.CANARY_ENDED, f"stopped by {who}: {why}")
            return f"registry version {mv.version}: canary ended, challenger dropped"
        return f"registry version {mv.version} keeps status {mv.tags.get(promote.STATUS)!r}"
    except Exception as err:  # noqa: BLE001 - the gateway did what was asked; say what the registry did not
        return f"registry not updated ({type(err).__name__}: {err})"


def record_canary_share(cfg: TracerlConfig, tenant: str, task: str, adapter_version: int, share: float,
                        who: str, why: str) -> str:
    """Write a share the gateway's admin API just set into the registry's canary, so every other
    gateway's reconcile runs it too (and this one's does not set it back). A note, never a failure."""
    from pipelines.adapters import promote, registry

    try:
        mv = promote.canary_version(cfg, tenant, task)
        if mv is None or str(mv.version) != str(getattr(registry.version_for_adapter(
                cfg, tenant, task, int(adapter_version)), "version", None)):
            return f"adapter v{adapter_version} is not the registry's canary: the registry is unchanged"
        promote.set_canary_share(cfg, tenant, task, str(mv.version), share, who, why)
        return f"registry version {mv.version} runs at share {share}"
    except Exception as err:  # noqa: BLE001 - the gateway did what was asked; say what the registry did not
        return f"registry not updated ({type(err).__name__}: {err})"
