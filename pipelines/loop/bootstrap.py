"""The first champion: a fresh LoRA adapter (B = 0, so it serves exactly the base model).

The gateway serves adapters only, so a new tenant/task starts with version 1 of its
lineage: registered in MLflow, aliased `champion`, deployed like any other version. The
learner's first candidate is its child, and every later version keeps the same LoRA shape.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pipelines.adapters import registry
from pipelines import tracking
from pipelines.config import TracerlConfig
from pipelines.adapters.store import AdapterStore


def ensure_champion(cfg: TracerlConfig, tenant: str, task: str) -> int:
    """The champion's adapter version, creating and registering version 1 if there is none."""
    import mlflow

    from pipelines.models.registry import base_model_hash, resolve_base_model
    from pipelines.train.step import build_policy

    current = registry.adapter_for_alias(cfg, tenant, task, registry.CHAMPION)
    if current is not None:
        return current
    base = resolve_base_model(cfg.train.base_model, cfg.home)
    model, _ = build_policy(base, None, cfg.train, seed=cfg.train.seed)
    tags = {"tenant": tenant, "task": task, "parent_version": "base", "base_model": cfg.train.base_model}
    cfg.home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cfg.home) as tmp:
        model.save_pretrained(Path(tmp) / "adapter")
        with tracking.run(cfg, f"bootstrap {tenant}/{task}", tags={**tags, "tracerl.stage": "bootstrap"},
                          params={"train": cfg.train.to_dict()}) as run:
            version = AdapterStore(cfg.adapter_root).publish(tenant, task, Path(tmp) / "adapter", {
                "parent_version": None, "base_model_hash": base_model_hash(base),
                "data_window": {"turns": 0, "note": "fresh LoRA, B = 0: serves the base model unchanged"},
                "reward_spec_version": [], "config": cfg.train.to_dict(), "metrics": {},
                "mlflow_run_id": run.info.run_id})
            mlflow.log_artifacts(str(version.path), "adapter")
            mlflow.set_tag("adapter_version", version.version)
    rv = registry.register_candidate(cfg, tenant, task, run.info.run_id, version.version, {**tags, "data_turns": 0})
    registry.set_alias(cfg, tenant, task, registry.CHAMPION, rv)
    return version.version


def ensure_serving(cfg: TracerlConfig, tenant: str, task: str) -> int:
    """Make the running gateway serve the champion of tenant/task; returns its adapter version.

    The swap goes through `reconcile`, like every other: the alias says what serves, the route follows."""
    from pipelines.deploy.reconcile import reconcile

    version = ensure_champion(cfg, tenant, task)
    (result,) = reconcile(cfg, [(tenant, task)], who="bootstrap").targets
    if result.outcome not in ("in_sync", "swapped"):
        raise RuntimeError(f"cannot serve the first champion: {result.line()}")
    return version
