"""The registry side of the gate: version tags, aliases, review approval, rollback.

Version tags the gate writes (MLflow UI, "Model versions"): ``tracerl.gate.decision``
(promote | reject | hold), ``tracerl.gate.status`` (awaiting_approval | promoted | rejected |
rolled_back), ``tracerl.gate.reasons``, ``tracerl.gate.run_id``, ``tracerl.gate.baseline``
(registry version compared against, or "base"), and per suite ``eval.<suite>.{candidate,
champion,delta,low,p_gain,n,items}`` (aggregates and a fingerprint of item hashes only).
Aliases: ``challenger`` = passed and under review; ``champion`` = live. The champion's
``tracerl.previous_champion`` tag is what rollback moves back to.
"""

from __future__ import annotations

from typing import Any, Callable

from pipelines.config import TracerlConfig
from pipelines.registry import CHALLENGER, CHAMPION, model_name
from pipelines.tracking import client

Deploy = Callable[[str, str, int], Any]  # (tenant, task, adapter_version): make it live in vLLM
STATUS, DECISION = "tracerl.gate.status", "tracerl.gate.decision"
AWAITING, PROMOTED, REJECTED, ROLLED_BACK = "awaiting_approval", "promoted", "rejected", "rolled_back"
PREVIOUS = "tracerl.previous_champion"


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


def mark_rejected(cfg: TracerlConfig, tenant: str, task: str, version: str) -> None:
    _drop_alias_if(cfg, tenant, task, CHALLENGER, version)
    set_tags(cfg, tenant, task, version, {STATUS: REJECTED})


def promote(cfg: TracerlConfig, tenant: str, task: str, version: str, deploy: Deploy | None = None,
            who: str = "gate") -> dict[str, Any]:
    """Deploy first (if given), then move ``champion`` to ``version``: a failed deploy leaves the
    registry pointing at what still serves."""
    c, name = client(cfg), model_name(tenant, task)
    mv = c.get_model_version(name, str(version))
    adapter_version = int(mv.tags["adapter_version"])
    old = alias_version(cfg, tenant, task, CHAMPION)
    if old is not None and str(old.version) == str(version):
        raise RegistryError(f"{name} version {version} is already the champion")
    if deploy is not None:
        deploy(tenant, task, adapter_version)
    c.set_registered_model_alias(name, CHAMPION, str(version))
    _drop_alias_if(cfg, tenant, task, CHALLENGER, version)
    set_tags(cfg, tenant, task, version, {STATUS: PROMOTED, "tracerl.promoted_by": who,
                                          PREVIOUS: old.version if old is not None else ""})
    return {"model": name, "champion": str(version), "previous": old.version if old else None,
            "adapter_version": adapter_version, "deployed": deploy is not None}


def pending_approvals(cfg: TracerlConfig, tenant: str, task: str, approval_tag: str) -> list[str]:
    """Versions held for review that a person approved (tag ``approval_tag`` = true/yes/1)."""
    c, name = client(cfg), model_name(tenant, task)
    out = []
    for mv in c.search_model_versions(f"name = '{name}'"):
        if mv.tags.get(STATUS) == AWAITING and str(mv.tags.get(approval_tag, "")).strip().lower() in ("true", "yes", "1"):
            out.append(str(mv.version))
    return sorted(out, key=int)


def promote_approved(cfg: TracerlConfig, tenant: str, task: str, approval_tag: str,
                     deploy: Deploy | None = None) -> list[dict[str, Any]]:
    """Promote each approved held version, oldest first (the newest ends up champion)."""
    return [promote(cfg, tenant, task, v, deploy, who=f"approval:{approval_tag}")
            for v in pending_approvals(cfg, tenant, task, approval_tag)]


def rollback(cfg: TracerlConfig, tenant: str, task: str, deploy: Deploy | None = None) -> dict[str, Any]:
    """Move ``champion`` back to the version it replaced and redeploy that adapter."""
    c, name = client(cfg), model_name(tenant, task)
    cur = alias_version(cfg, tenant, task, CHAMPION)
    if cur is None:
        raise RegistryError(f"{name} has no champion to roll back")
    prev = cur.tags.get(PREVIOUS, "")
    if not prev:
        raise RegistryError(f"{name} champion version {cur.version} replaced nothing (no {PREVIOUS} tag); "
                            f"set the alias by hand in the MLflow UI to pick a version")
    prev_mv = c.get_model_version(name, prev)
    if deploy is not None:
        deploy(tenant, task, int(prev_mv.tags["adapter_version"]))
    c.set_registered_model_alias(name, CHAMPION, prev)
    set_tags(cfg, tenant, task, cur.version, {STATUS: ROLLED_BACK})
    return {"model": name, "champion": prev, "rolled_back": str(cur.version),
            "adapter_version": int(prev_mv.tags["adapter_version"])}


def all_pending_approvals(cfg: TracerlConfig, approval_tag: str) -> list[tuple[str, str, str]]:
    """(tenant, task, version) of every approved held version across registered models."""
    out = []
    for rm in client(cfg).search_registered_models():
        tenant, task = rm.tags.get("tenant"), rm.tags.get("task")
        if tenant and task:
            out += [(tenant, task, v) for v in pending_approvals(cfg, tenant, task, approval_tag)]
    return out
