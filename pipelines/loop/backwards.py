"""The canary demo's deliberately bad candidate: a candidate's update applied backwards.

A LoRA adapter serves W + s·B·A. Negating every B serves W − s·B·A: the adapter's whole update
over the base model, reversed. For a candidate grown from the bootstrap champion (B = 0, the base
model), that is to first order the update the learner would have made from the same turns with
every reward's sign inverted (the policy gradient is linear in the reward): the "trained on
inverted rewards" candidate, made in a second, deterministic, without a training run of its own.
``scale`` < 1 reverses part of it (B -> -scale·B serves W - scale·s·B·A): a candidate only a little
worse than the base, the kind an offline gate with few items may not tell from the champion.

It is published, logged and registered as any candidate is (lineage: its parent is the version
it reverses), so the gate, the canary and the registry meet it as they would meet the learner's.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pipelines import tracking
from pipelines.adapters import registry
from pipelines.adapters.store import AdapterStore
from pipelines.config import TracerlConfig

WEIGHTS = "adapter_model.safetensors"


def reverse_update(src: Path, dest: Path, scale: float = 1.0) -> int:
    """Copy the PEFT folder ``src`` to ``dest`` with every ``lora_B`` tensor times ``-scale``; how many."""
    from safetensors.torch import load_file, save_file

    if not scale > 0:
        raise ValueError(f"scale={scale}: must be > 0 (0 would serve the base model, not a reversed update)")
    shutil.copytree(src, dest)
    tensors = load_file(str(Path(src) / WEIGHTS))
    flipped = [k for k in tensors if ".lora_B." in k]
    if not flipped:
        raise ValueError(f"{src}: no lora_B tensors in {WEIGHTS}; not a LoRA adapter")
    save_file({k: -scale * v if k in flipped else v for k, v in tensors.items()}, str(Path(dest) / WEIGHTS),
              metadata={"format": "pt"})
    return len(flipped)


def publish_backwards(cfg: TracerlConfig, tenant: str, task: str, version: int, who: str = "demo",
                      scale: float = 1.0) -> int:
    """Publish adapter ``version`` of tenant/task reversed (``scale`` of its update) as the next
    version, with an MLflow run and a registry version (tagged as deliberately bad); its adapter version."""
    import mlflow

    store = AdapterStore(cfg.adapter_root)
    src = store.get(tenant, task, version)
    part = "" if scale == 1.0 else f" at {scale:g} of its size"
    why = (f"deliberately bad: adapter v{version}'s update applied backwards{part} (lora_B times -{scale:g}), to "
           f"first order the learner's step on inverted rewards")
    tags = {"tenant": tenant, "task": task, "parent_version": str(version), "tracerl.deliberately_bad": "true"}
    cfg.home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cfg.home) as tmp:
        n = reverse_update(src.path, Path(tmp) / "adapter", scale)
        with tracking.run(cfg, f"backwards {tenant}/{task} v{version}",
                          tags={**tags, "tracerl.stage": "demo", "mlflow.note.content": why},
                          params={"reversed_version": version, "negated_tensors": n, "scale": scale}) as run:
            meta = {k: v for k, v in src.meta.items() if k not in ("tenant", "task", "version", "created_at")}
            out = store.publish(tenant, task, Path(tmp) / "adapter", {
                **meta, "parent_version": version, "metrics": {}, "mlflow_run_id": run.info.run_id,
                "config": {**(meta.get("config") or {}), "deliberately_bad": why, "negated_tensors": n,
                           "reversed_scale": scale}})
            mlflow.log_artifacts(str(out.path), "adapter")
            mlflow.set_tag("adapter_version", out.version)
    registry.register_candidate(cfg, tenant, task, run.info.run_id, out.version, {**tags, "who": who})
    return out.version
