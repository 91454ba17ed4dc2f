"""Every move of the registry's aliases: the gate's promote, review approval, operator deploy, rollback.

It sits with the adapters (not in the gate) because the gate, the deployer's operations and
reconcile, and the CLI all move or read the alias: none of them imports another for it.

The registry's ``champion`` alias is the one record of what should serve; the gateway follows
it (pipelines/deploy/reconcile.py). Everything that moves it goes through ``move_champion``,
which records who moved it and why.

Version tags the gate writes (MLflow UI, "Model versions"): ``tracerl.gate.decision``
(promote | reject | hold), ``tracerl.gate.status`` (awaiting_approval | promoted | rejected |
rolled_back), ``tracerl.gate.reasons``, ``tracerl.gate.run_id`` (and, where they apply,
``tracerl.gate.contamination``, ``tracerl.gate.blocked_by``): the tags people search; the
per-suite figures are the gate run's metrics and its description (pipelines/gate/review.py).
Aliases: ``challenger`` = passed and under review, or serving a canary (pipelines/canary/run.py);
``champion`` = what serves. The champion's
``tracerl.previous_champion`` tag is what rollback moves back to; ``tracerl.champion_reason``
says why it is champion ("promote by gate", "rollback by alice: latency regression"), and
``tracerl.alias_history`` lists every alias move of the version, oldest first.
"""

from __future__ import annotations

import uuid

from datetime import datetime, timezone
from typing import Any, Callable

from pipelines.config import TracerlConfig
from pipelines.adapters.registry import CHALLENGER, CHAMPION, model_name
from pipelines.adapters.version import label
from pipelines.adapters.version import tag_version as adapter_of
from pipelines.tracking import client

Deploy = Callable[[str, str, int], Any]  # (tenant, task, adapter_version): make it live in vLLM
STATUS, DECISION = "tracerl.gate.status", "tracerl.gate.decision"
AWAITING, PROMOTED, REJECTED, ROLLED_BACK = "awaiting_approval", "promoted", "rejected", "rolled_back"
CANARY_ID = "tracerl.canary.id"  # the id that decides each conversation's side (routing.bucket)
CANARY_SHARE = "tracerl.canary.share"  # the challenger's share of conversations, as every gateway runs it
CANARY, CANARY_ENDED = "canary", "canary_ended"  # serving a canary now; a canary of it expired or was stopped
PREVIOUS = "tracerl.previous_champion"
REASON, HISTORY = "tracerl.champion_reason", "tracerl.alias_history"
HISTORY_SEP = " | "
MAX_TAG = 5000  # MLflow's limit on a tag value


class RegistryError(RuntimeError):
    pass


def alias_version(cfg: TracerlConfig, tenant: str, task: str, alias: str) -> Any | None:
    from mlflow.exceptions import MlflowException

    try:
        return client(cfg).get_model_version_by_alias(model_name(tenant, task), alias)
    except MlflowException:
        return None


def set_tags(cfg: TracerlConfig, tenant: str, task: str, version: str, tags: dict[str, Any]) -> None:
    c, name = client(cfg), model_name(tenant, task)
    for k, v in tags.items():
        c.set_model_version_tag(name, str(version), k, str(v)[:5000])


def _drop_alias_if(cfg: TracerlConfig, tenant: str, task: str, alias: str, version: str) -> None:
    mv = alias_version(cfg, tenant, task, alias)
    if mv is not None and str(mv.version) == str(version):
        client(cfg).delete_registered_model_alias(model_name(tenant, task), alias)


def mark_challenger(cfg: TracerlConfig, tenant: str, task: str, version: str) -> None:
    client(cfg).set_registered_model_alias(model_name(tenant, task), CHALLENGER, str(version))
    set_tags(cfg, tenant, task, version, {STATUS: AWAITING})


def canary_version(cfg: TracerlConfig, tenant: str, task: str) -> Any | None:
    """The version that should run a canary: ``challenger`` with status ``canary``, or None. The
    gateway's canary follows it (pipelines/deploy/reconcile.py) as its route follows ``champion``."""
    mv = alias_version(cfg, tenant, task, CHALLENGER)
    return mv if mv is not None and mv.tags.get(STATUS) == CANARY else None


def enter_canary(cfg: TracerlConfig, tenant: str, task: str, version: str, who: str, why: str = "",
                 canary_id: str | None = None, share: float | None = None) -> None:
    """``version`` becomes the challenger that serves a canary (a canary of another version ends).
    ``canary_id``: the id the gateway that started it drew (a new one if None), kept as the
    ``tracerl.canary.id`` tag so every gateway puts each conversation on the same side; ``share``
    (None: the target's ``canary.share``) as ``tracerl.canary.share``, so every gateway runs it."""
    old = canary_version(cfg, tenant, task)
    if old is not None and str(old.version) == str(version):
        return
    if old is not None:
        end_canary(cfg, tenant, task, str(old.version), CANARY_ENDED, f"replaced by version {version} ({who})")
    # the id before the alias and the status (tags are set one at a time): a gateway that reads
    # this version as the canary (challenger, status canary) reads its id too
    tags = {CANARY_ID: canary_id or uuid.uuid4().hex, "tracerl.canary.started_by": who}
    set_tags(cfg, tenant, task, version, tags | ({} if share is None else {CANARY_SHARE: float(share)}))
    client(cfg).set_registered_model_alias(model_name(tenant, task), CHALLENGER, str(version))
    set_tags(cfg, tenant, task, version, {STATUS: CANARY})
    note_history(cfg, tenant, task, version, f"became challenger serving a canary: {who}" + (f": {why}" if why else ""))


def canary_share(cfg: TracerlConfig, tenant: str, task: str, mv: Any) -> float:
    """The share the registry's canary ``mv`` runs at: its tag, else the target's ``canary.share``."""
    tag = mv.tags.get(CANARY_SHARE)
    return float(tag) if tag is not None else cfg.for_target(tenant, task).canary.share


def set_canary_share(cfg: TracerlConfig, tenant: str, task: str, version: str, share: float, who: str,
                     why: str = "") -> None:
    """The canary of ``version`` runs at ``share`` from now on, on every gateway (each reconciles to it)."""
    set_tags(cfg, tenant, task, version, {CANARY_SHARE: float(share)})
    note_history(cfg, tenant, task, version, f"canary share {share}: {who}" + (f": {why}" if why else ""))


def end_canary(cfg: TracerlConfig, tenant: str, task: str, version: str, status: str, why: str) -> None:
    """The canary of ``version`` ended without a promotion: ``status`` (rejected on a rollback,
    canary_ended on an expiry or a stop) and the ``challenger`` alias dropped."""
    _drop_alias_if(cfg, tenant, task, CHALLENGER, version)
    set_tags(cfg, tenant, task, version, {STATUS: status})
    note_history(cfg, tenant, task, version, f"canary ended ({status}): {why}")


def mark_rejected(cfg: TracerlConfig, tenant: str, task: str, version: str) -> None:
    _drop_alias_if(cfg, tenant, task, CHALLENGER, version)
    set_tags(cfg, tenant, task, version, {STATUS: REJECTED})


def now() -> str:
    """UTC, to the second: the time format of every tag this module writes."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def note_history(cfg: TracerlConfig, tenant: str, task: str, version: str, entry: str) -> None:
    """Append ``<time> <entry>`` to the version's ``tracerl.alias_history`` (oldest entries drop
    first when the tag would pass MLflow's 5000 characters)."""
    mv = client(cfg).get_model_version(model_name(tenant, task), str(version))
    entries = [e for e in mv.tags.get(HISTORY, "").split(HISTORY_SEP) if e] + [f"{now()} {entry}"]
    while len(HISTORY_SEP.join(entries)) > MAX_TAG and len(entries) > 1:
        entries.pop(0)
    set_tags(cfg, tenant, task, version, {HISTORY: HISTORY_SEP.join(entries)})


def move_champion(cfg: TracerlConfig, tenant: str, task: str, version: str, *, action: str, who: str,
                  why: str = "", extra_tags: dict[str, Any] | None = None) -> dict[str, Any]:
    """Point ``champion`` at ``version`` and record the move on the versions it touches: the one
    place the alias moves (gate, approval, operator deploy, rollback). ``action`` names the move
    in the reason ("promote", "approve", "deploy", "rollback")."""
    c, name = client(cfg), model_name(tenant, task)
    mv = c.get_model_version(name, str(version))
    old = alias_version(cfg, tenant, task, CHAMPION)
    reason = f"{action} by {who}" + (f": {why}" if why else "")
    c.set_registered_model_alias(name, CHAMPION, str(version))
    _drop_alias_if(cfg, tenant, task, CHALLENGER, version)
    tags = {REASON: reason, **(extra_tags or {})}
    if action != "rollback":  # a rollback target keeps the status and previous champion it had
        tags.update({STATUS: PROMOTED, "tracerl.promoted_by": who, PREVIOUS: old.version if old is not None else ""})
    set_tags(cfg, tenant, task, version, tags)
    was = label(adapter_of(old)) if old is not None else label(None)
    note_history(cfg, tenant, task, version, f"became champion (was {was}): {reason}")
    if old is not None and str(old.version) != str(version):
        note_history(cfg, tenant, task, old.version, f"lost champion to {label(adapter_of(mv))}: {reason}")
    return {"model": name, "champion": str(version), "previous": old.version if old else None,
            "adapter_version": adapter_of(mv), "previous_adapter_version": adapter_of(old) if old else None,
            "reason": reason}


def promote(cfg: TracerlConfig, tenant: str, task: str, version: str, deploy: Deploy | None = None,
            who: str = "gate", why: str = "", action: str = "promote") -> dict[str, Any]:
    """Deploy first (if given), then move ``champion`` to ``version``: a failed deploy leaves the
    registry pointing at what still serves. Without ``deploy`` the next reconcile serves it.

    Refuses a version an operator rolled back: only an operator's ``tracerl deploy`` may serve it
    again, so no automatic path undoes a rollback."""
    c, name = client(cfg), model_name(tenant, task)
    mv = c.get_model_version(name, str(version))
    old = alias_version(cfg, tenant, task, CHAMPION)
    if old is not None and str(old.version) == str(version):
        raise RegistryError(f"{name} version {version} is already the champion")
    if mv.tags.get(STATUS) == ROLLED_BACK:
        raise RegistryError(f"{name} version {version} (adapter v{adapter_of(mv)}) was rolled back "
                            f"({mv.tags.get(HISTORY, '').split(HISTORY_SEP)[-1]}); only an operator can serve it "
                            f"again: tracerl deploy {tenant} {task} {adapter_of(mv)} --why ...")
    if deploy is not None:
        deploy(tenant, task, adapter_of(mv))
    done = move_champion(cfg, tenant, task, version, action=action, who=who, why=why)
    return {**done, "deployed": deploy is not None}


def pending_approvals(cfg: TracerlConfig, tenant: str, task: str, approval_tag: str) -> list[str]:
    """Versions held for review that a person approved (tag ``approval_tag`` = true/yes/1)."""
    c, name = client(cfg), model_name(tenant, task)
    out = []
    for mv in c.search_model_versions(f"name = '{name}'"):
        if mv.tags.get(STATUS) == AWAITING and str(mv.tags.get(approval_tag, "")).strip().lower() in ("true", "yes", "1"):
            out.append(str(mv.version))
    return sorted(out, key=int)


def _held(cfg: TracerlConfig, tenant: str, task: str, version: str) -> Any:
    mv = client(cfg).get_model_version(model_name(tenant, task), str(version))
    if mv.tags.get(STATUS) != AWAITING:
        raise RegistryError(f"{model_name(tenant, task)} version {version} (adapter v{adapter_of(mv)}) is not "
                            f"awaiting approval (status {mv.tags.get(STATUS) or 'none'}, gate decision "
                            f"{mv.tags.get(DECISION) or 'none'}); only a version the gate held for review "
                            f"can be approved or rejected")
    return mv


def approve(cfg: TracerlConfig, tenant: str, task: str, version: str, who: str, why: str = "",
            deploy: Deploy | None = None) -> dict[str, Any]:
    """A reviewer's approval of a held version: it becomes champion (the review desk's promote)."""
    _held(cfg, tenant, task, version)
    set_tags(cfg, tenant, task, version, {"tracerl.approved_by": who, "tracerl.approved_why": why})
    return promote(cfg, tenant, task, version, deploy, who=who, why=why, action="approve")


def reject_held(cfg: TracerlConfig, tenant: str, task: str, version: str, who: str, why: str) -> dict[str, Any]:
    """A reviewer's rejection of a held version: status rejected, ``challenger`` dropped."""
    mv = _held(cfg, tenant, task, version)
    mark_rejected(cfg, tenant, task, version)
    set_tags(cfg, tenant, task, version, {"tracerl.rejected_by": who, "tracerl.rejected_why": why})
    note_history(cfg, tenant, task, version, f"rejected in review by {who}: {why}")
    return {"model": model_name(tenant, task), "rejected": str(version), "adapter_version": adapter_of(mv)}


def promote_approved(cfg: TracerlConfig, tenant: str, task: str, approval_tag: str,
                     deploy: Deploy | None = None, who: str | None = None) -> list[dict[str, Any]]:
    """Approve each held version carrying the approval tag (set in the MLflow UI), oldest first
    (the newest ends up champion)."""
    who = who or f"mlflow-ui ({approval_tag} tag)"
    return [approve(cfg, tenant, task, v, who, f"{approval_tag} = true on the version", deploy)
            for v in pending_approvals(cfg, tenant, task, approval_tag)]


def rollback(cfg: TracerlConfig, tenant: str, task: str, deploy: Deploy | None = None, who: str = "operator",
             why: str = "") -> dict[str, Any]:
    """Move ``champion`` back to the version it replaced (and deploy that adapter, if given); the
    current champion is marked rolled back, so nothing automatic makes it champion again."""
    c, name = client(cfg), model_name(tenant, task)
    cur = alias_version(cfg, tenant, task, CHAMPION)
    if cur is None:
        raise RegistryError(f"{name} has no champion to roll back")
    prev = cur.tags.get(PREVIOUS, "")
    if not prev:
        raise RegistryError(f"{name} champion version {cur.version} (adapter v{adapter_of(cur)}) replaced nothing "
                            f"(no {PREVIOUS} tag); pick the version to serve: "
                            f"tracerl deploy {tenant} {task} ADAPTER_VERSION --why ...")
    prev_mv = c.get_model_version(name, prev)
    if prev_mv.tags.get(STATUS) == ROLLED_BACK:
        raise RegistryError(f"{name} champion version {cur.version} replaced version {prev}, which was rolled back "
                            f"itself; pick the version to serve: tracerl deploy {tenant} {task} ADAPTER_VERSION --why ...")
    if deploy is not None:
        deploy(tenant, task, adapter_of(prev_mv))
    set_tags(cfg, tenant, task, cur.version, {STATUS: ROLLED_BACK, "tracerl.rolled_back_by": who,
                                              "tracerl.rolled_back_why": why})
    done = move_champion(cfg, tenant, task, prev, action="rollback", who=who, why=why)
    return {**done, "rolled_back": str(cur.version)}


def all_pending_approvals(cfg: TracerlConfig, approval_tag: str) -> list[tuple[str, str, str]]:
    """(tenant, task, version) of every approved held version across registered models."""
    out = []
    for rm in client(cfg).search_registered_models():
        tenant, task = rm.tags.get("tenant"), rm.tags.get("task")
        if tenant and task:
            out += [(tenant, task, v) for v in pending_approvals(cfg, tenant, task, approval_tag)]
    return out
