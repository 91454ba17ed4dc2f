"""The ``retrain`` policy's deadline: a champion trained on a forgotten user serves at most
``privacy.retrain_deadline_hours`` after the forget (docs/privacy.md#adapters-trained-on-a-user).

Before the deadline the normal loop is expected to replace it: the learner trains the next
candidate from the champion's last clean ancestor (pipelines/train/branch.py), without the user's
turns (deleted from the lake), and the gate (and canary) promote it as any other. ``enforce_deadline``
runs hourly (the Dagster schedule ``forget_deadline_schedule``): for every completed forget under
``retrain`` whose deadline passed, a target whose champion is still marked is moved to the newest
unmarked ancestor the operator deploy accepts (never one the gate or a reviewer rejected), or, when
there is none, to the base model (the ``champion`` alias removed, the route dropped), and the
gateway reconciled. Each move is recorded on the registry like an operator's, by ``tracerl forget``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pipelines.config import TracerlConfig
from pipelines.privacy import forget_requests as fr

WHO = "tracerl forget"


def _when(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def enforce_deadline(cfg: TracerlConfig, now: datetime | None = None) -> list[dict[str, Any]]:
    """Replace every champion still marked past its forget's deadline; what was done, per target."""
    from pipelines.adapters import promote, registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.deploy import operations
    from pipelines.train.branch import forgotten

    now = now or datetime.now(timezone.utc)
    store, done, seen = AdapterStore(cfg.adapter_root), [], set()
    for req in fr.all_requests(cfg.home):
        if req.get("status") != fr.DONE or req.get("policy") != "retrain" or not req.get("deadline"):
            continue
        if _when(req["deadline"]) > now:
            continue
        tenant = req["tenant"]
        for task in sorted({v["task"] for v in req.get("versions", [])}):
            if (tenant, task) in seen:
                continue
            seen.add((tenant, task))
            champ = registry.adapter_for_alias(cfg, tenant, task, registry.CHAMPION)
            if champ is None:
                continue
            try:
                champ_av = store.get(tenant, task, champ)
            except KeyError:
                continue
            if not forgotten(champ_av):
                continue  # a clean champion was promoted in time
            why = f"deadline of {req['id']}: v{champ} trained on a forgotten user"
            result: dict[str, Any] = {"tenant": tenant, "task": task, "from": champ, "forget": req["id"]}
            for av in store.lineage(tenant, task, champ)[1:]:
                if forgotten(av):
                    continue
                try:
                    act = operations.deploy(cfg, tenant, task, av.version, who=WHO, why=why)
                except (operations.Refused, operations.NotRegistered):
                    continue
                result.update(to=av.version, summary=act.summary())
                break
            else:
                cur = promote.alias_version(cfg, tenant, task, registry.CHAMPION)
                promote.set_tags(cfg, tenant, task, cur.version, {promote.STATUS: promote.ROLLED_BACK,
                                                                  "tracerl.rolled_back_by": WHO,
                                                                  "tracerl.rolled_back_why": why})
                promote.note_history(cfg, tenant, task, cur.version, f"{promote.now()} champion removed by {WHO}: {why}")
                from pipelines.tracking import client

                client(cfg).delete_registered_model_alias(registry.model_name(tenant, task), registry.CHAMPION)
                from pipelines.deploy.reconcile import reconcile

                report = reconcile(cfg, [(tenant, task)], who=WHO)
                result.update(to="base", summary=report.targets[0].line())
            done.append(result)
    return done
