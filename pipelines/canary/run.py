"""Advance a running canary: its settled sessions from the lake, the decision, the action, the records.

One step, safe to run as often as rewards settle (the Dagster sensor, `tracerl canary check`): the
confidence sequences may be looked at after every batch. The canary itself lives in the gateway's
route (``<home>/deploy/routes.json``, started with `tracerl canary start` or ``/admin/canary``);
this step reads it there, so it needs no gateway to decide ``continue``.

- **promote**: ``champion`` moves to the challenger (operations.deploy, who = ``canary``), and the
  swap ends the canary: every conversation on the new champion.
- **roll back**: the canary stops (all traffic to the champion, zero failed requests) and the
  version is marked rejected (``tracerl.gate.status``), so nothing serves it again without
  ``tracerl deploy --force``.
- **expire**: the canary stops; the version keeps its status (it may be tried again).

Records: the registry's ``challenger`` alias with status ``canary`` names the version a canary is
running (the gate sets it; the ``deployment`` asset's reconcile then starts the canary in the
gateway; a canary started in the gateway alone is recorded on its first step; dropped when it ends); the model version gets ``tracerl.canary.*`` tags (decision, reasons,
sessions per arm, the MLflow run); one MLflow run per canary (tag ``tracerl.canary.id``) holds
per-arm metrics over time, one point per step at step = settled sessions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pipelines.adapters import promote
from pipelines.canary.decide import CHALLENGER_ARM, CHAMPION_ARM, CONTINUE, EXPIRE, PROMOTE, ROLLBACK, \
    CanaryDecision, Session, decide
from pipelines.canary.sessions import GUARDRAIL_COLUMNS, canary_sessions
from pipelines.config import TracerlConfig
from pipelines.deploy.routing import Live, Router

WHO = "canary"
ENDED = (promote.REJECTED, promote.CANARY_ENDED, promote.ROLLED_BACK)
TAG = "tracerl.canary."


@dataclass
class CanaryStep:
    """What one step saw and did for one tenant/task."""

    tenant: str
    task: str
    action: str                          # no_canary | continue | promoted | rolled_back | expired | failed
    champion: int | None = None
    challenger: int | None = None
    decision: CanaryDecision | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        if self.decision is None:
            return f"{self.tenant}/{self.task}: {self.action}"
        return (f"{self.tenant}/{self.task}: v{self.challenger} vs v{self.champion}: {self.action} "
                f"({self.decision.sessions[1]} / {self.decision.sessions[0]} sessions; "
                f"{'; '.join(self.decision.reasons)})")

    def to_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "task": self.task, "action": self.action, "champion": self.champion,
                "challenger": self.challenger, "decision": self.decision.to_dict() if self.decision else None,
                **self.detail}


def live_canaries(cfg: TracerlConfig) -> list[Live]:
    """Routes that run a canary now, as the gateway last wrote them."""
    return [r for r in Router(cfg.routes_path).routes() if r.canary is not None]


def advance(cfg: TracerlConfig, tenant: str, task: str, now: datetime | None = None) -> CanaryStep:
    """One step of the tenant/task's canary; ``no_canary`` when none runs."""
    live = Router(cfg.routes_path).live(tenant, task)
    if live is None or live.canary is None:
        return CanaryStep(tenant, task, "no_canary")
    c = live.canary
    started = datetime.fromisoformat(c.started_at.replace("Z", "+00:00"))
    now = now or datetime.now(timezone.utc)
    sessions = canary_sessions(cfg.lake, cfg.table_store, tenant, task, started, live.version, c.version)
    # the propensity is the share the canary runs at (a share changed mid-canary: the current one)
    ccfg = dataclasses.replace(cfg.for_target(tenant, task).canary, share=c.share)
    decision = decide(sessions, ccfg, (now - started).total_seconds() / 3600)
    step = CanaryStep(tenant, task, CONTINUE, live.version, c.version, decision)
    step.detail["run_id"] = _log(cfg, live, sessions, decision)
    mv = _registry_version(cfg, tenant, task, c.version)
    if mv is not None and mv.tags.get(promote.STATUS) in ENDED:  # decided before; the gateway lags
        step.action = "stopped"
        try:
            step.detail["result"] = _stop(cfg, tenant, task, f"the registry says {mv.tags[promote.STATUS]}")
        except Exception as err:  # noqa: BLE001
            step.action, step.detail["error"] = "failed", f"{type(err).__name__}: {err}"
        return step
    if mv is not None:
        _set_challenger(cfg, tenant, task, mv, c.id)
    if decision.outcome == CONTINUE:
        return step
    why = f"canary {decision.outcome}: {'; '.join(decision.reasons)}"
    try:
        if decision.outcome == PROMOTE:
            step.detail["result"] = _promote(cfg, tenant, task, c.version, why)
            step.action = "promoted"
        else:  # the registry first (what should run), then the gateway follows
            if mv is not None:
                _record_end(cfg, tenant, task, mv, decision, step.detail["run_id"])
            step.detail["result"] = _stop(cfg, tenant, task, why)
            step.action = "rolled_back" if decision.outcome == ROLLBACK else "expired"
    except Exception as err:  # noqa: BLE001 - the next step (or the deployment's reconcile) retries
        step.action, step.detail["error"] = "failed", f"{type(err).__name__}: {err}"
        return step
    if mv is not None and decision.outcome == PROMOTE:
        _record_end(cfg, tenant, task, mv, decision, step.detail["run_id"])
    return step


def advance_all(cfg: TracerlConfig) -> list[CanaryStep]:
    return [advance(cfg, r.tenant, r.task) for r in live_canaries(cfg)]


# -- actions ---------------------------------------------------------------------------------------

def _promote(cfg: TracerlConfig, tenant: str, task: str, version: int, why: str) -> dict[str, Any]:
    from pipelines.deploy import operations

    result = operations.deploy(cfg, tenant, task, version, WHO, why)
    if not result.ok:
        raise RuntimeError(result.summary())
    return result.to_dict()


def _stop(cfg: TracerlConfig, tenant: str, task: str, why: str) -> dict[str, Any]:
    from pipelines.deploy.service import canary

    return canary(cfg, "stop", tenant, task, who=WHO, why=why[:1000])


# -- records ---------------------------------------------------------------------------------------

def _registry_version(cfg: TracerlConfig, tenant: str, task: str, version: int) -> Any | None:
    from pipelines.adapters import registry

    return registry.version_for_adapter(cfg, tenant, task, version)


def _set_challenger(cfg: TracerlConfig, tenant: str, task: str, mv: Any, canary_id: str) -> None:
    """The registry names the running canary (``challenger``, status ``canary``): a canary started
    in the gateway alone (before the registry knew it) is recorded on its first step."""
    current = promote.canary_version(cfg, tenant, task)
    if current is None or str(current.version) != str(mv.version):
        promote.enter_canary(cfg, tenant, task, str(mv.version), WHO, "the gateway runs it", canary_id)


def _record_end(cfg: TracerlConfig, tenant: str, task: str, mv: Any, decision: CanaryDecision, run_id: str) -> None:
    tags = {TAG + "decision": decision.outcome, TAG + "reasons": "; ".join(decision.reasons),
            TAG + "sessions": f"champion {decision.sessions[0]}, challenger {decision.sessions[1]}",
            TAG + "run_id": run_id, TAG + "decided_at": promote.now()}
    if decision.reward is not None:
        tags[TAG + "reward_gain"] = f"{decision.reward.estimate:+.4f} [{decision.reward.low:+.4f}, " \
                                    f"{decision.reward.high:+.4f}]"
    promote.set_tags(cfg, tenant, task, mv.version, tags)
    why = f"canary {decision.outcome}: {'; '.join(decision.reasons)}"
    if decision.outcome in (ROLLBACK, EXPIRE):
        promote.end_canary(cfg, tenant, task, str(mv.version),
                           promote.REJECTED if decision.outcome == ROLLBACK else promote.CANARY_ENDED, why)
    else:
        promote.note_history(cfg, tenant, task, mv.version, why)


def _log(cfg: TracerlConfig, live: Live, sessions: list[Session], decision: CanaryDecision) -> str:
    """This step's per-arm numbers in the canary's MLflow run (created on its first step)."""
    from pipelines.tracking import client, experiment_id

    c, canary = client(cfg), live.canary
    exp = experiment_id(cfg)
    found = c.search_runs([exp], f"tags.`{TAG}id` = '{canary.id}'", max_results=1)
    if found:
        run_id = found[0].info.run_id
    else:
        run = c.create_run(exp, run_name=f"canary {live.tenant}/{live.task} v{canary.version} vs v{live.version}",
                           tags={"tracerl.stage": "canary", TAG + "id": canary.id, "tracerl.tenant": live.tenant,
                                 "tracerl.task": live.task, TAG + "challenger": str(canary.version),
                                 TAG + "champion": str(live.version), TAG + "share": str(canary.share),
                                 TAG + "started_at": canary.started_at})
        run_id = run.info.run_id
    t = sum(decision.sessions)
    metrics = {"sessions_champion": decision.sessions[0], "sessions_challenger": decision.sessions[1]}
    for arm, side in ((CHAMPION_ARM, "champion"), (CHALLENGER_ARM, "challenger")):
        mine = [s for s in sessions if s.arm == arm]
        if mine:
            metrics[f"reward_{side}"] = sum(s.reward for s in mine) / len(mine)
            for name in GUARDRAIL_COLUMNS:
                vals = [s.metrics[name] for s in mine if name in s.metrics]
                if vals:
                    metrics[f"{name}_{side}"] = sum(vals) / len(vals)
    if decision.reward is not None:
        metrics.update(gain=decision.reward.estimate, gain_low=decision.reward.low, gain_high=decision.reward.high)
    for k, v in metrics.items():
        c.log_metric(run_id, k, float(v), step=t)
    c.set_tag(run_id, TAG + "outcome", decision.outcome)
    c.set_tag(run_id, TAG + "reasons", "; ".join(decision.reasons)[:5000])
    if decision.outcome != CONTINUE:
        c.set_terminated(run_id)
    return run_id
