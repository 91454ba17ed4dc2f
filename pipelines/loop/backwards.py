"""The canary demo's deliberately bad candidate: a share of a candidate's update taken back.

A LoRA adapter serves W + s·B·A = W + ΔW. Scaling every B by (1 − κ) serves W + (1 − κ)·ΔW:
``take_back`` κ of the update undone. κ = 2 negates B and serves W − ΔW, the whole update reversed:
for a candidate grown from the bootstrap champion (B = 0, the base model), to first order the
update the learner would have made from the same turns with every reward's sign inverted (the
policy gradient is linear in the reward), made in a second, deterministically, without a training
run of its own. κ in (0, 1) steps back only part of the way along the update, the direction
inverted rewards push it: a candidate a little worse than the champion, the kind an offline gate
with few items cannot tell from it (κ = 1 would be the base model, which the registry already has).

It is published, logged and registered as any candidate is (lineage: its parent is the version
it steps back from), so the gate, the canary and the registry meet it as they would the learner's.
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


def check_take_back(take_back: float) -> float:
    """``take_back`` if it names a bad candidate, else ValueError: 0 is the adapter itself, 1 the base model."""
    if not take_back > 0 or take_back == 1:
        raise ValueError(f"take_back={take_back}: must be > 0 and not 1 (0 is the adapter itself, 1 the base "
                         f"model; 2 reverses the whole update)")
    return float(take_back)


def reverse_update(src: Path, dest: Path, take_back: float = 2.0) -> int:
    """Copy the PEFT folder ``src`` to ``dest`` with every ``lora_B`` tensor times ``1 - take_back``;
    how many tensors."""
    from safetensors.torch import load_file, save_file

    check_take_back(take_back)
    shutil.copytree(src, dest)
    tensors = load_file(str(Path(src) / WEIGHTS))
    flipped = [k for k in tensors if ".lora_B." in k]
    if not flipped:
        raise ValueError(f"{src}: no lora_B tensors in {WEIGHTS}; not a LoRA adapter")
    save_file({k: (1.0 - take_back) * v if k in flipped else v for k, v in tensors.items()}, str(Path(dest) / WEIGHTS),
              metadata={"format": "pt"})
    return len(flipped)


def describe(version: int, take_back: float) -> str:
    """What the candidate is, for its note, its config and the demo's log."""
    if take_back == 2.0:
        return (f"adapter v{version}'s update applied backwards (lora_B times -1): to first order the learner's "
                f"step on inverted rewards")
    if take_back > 1.0:
        return (f"adapter v{version}'s update applied backwards at {take_back - 1:g} of its size "
                f"(lora_B times {1 - take_back:g})")
    return (f"adapter v{version} with {take_back:g} of its update taken back (lora_B times {1 - take_back:g}): a step "
            f"back along its own update, the way inverted rewards push it")


def publish_backwards(cfg: TracerlConfig, tenant: str, task: str, version: int, who: str = "demo",
                      take_back: float = 2.0) -> int:
    """Publish adapter ``version`` of tenant/task with ``take_back`` of its update undone as the next
    version, with an MLflow run and a registry version (tagged as deliberately bad); its adapter version."""
    import mlflow

    store = AdapterStore(cfg.adapter_root)
    src = store.get(tenant, task, version)
    why = f"deliberately bad: {describe(version, take_back)}"
    tags = {"tenant": tenant, "task": task, "parent_version": str(version), "tracerl.deliberately_bad": "true"}
    cfg.home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cfg.home) as tmp:
        n = reverse_update(src.path, Path(tmp) / "adapter", take_back)
        with tracking.run(cfg, f"backwards {tenant}/{task} v{version}",
                          tags={**tags, "tracerl.stage": "demo", "mlflow.note.content": why},
                          params={"reversed_version": version, "scaled_tensors": n, "take_back": take_back}) as run:
            meta = {k: v for k, v in src.meta.items() if k not in ("tenant", "task", "version", "created_at")}
            out = store.publish(tenant, task, Path(tmp) / "adapter", {
                **meta, "parent_version": version, "metrics": {}, "mlflow_run_id": run.info.run_id,
                "config": {**(meta.get("config") or {}), "deliberately_bad": why, "scaled_tensors": n,
                           "take_back": take_back}})
            mlflow.log_artifacts(str(out.path), "adapter")
            mlflow.set_tag("adapter_version", out.version)
    registry.register_candidate(cfg, tenant, task, run.info.run_id, out.version, {**tags, "who": who})
    return out.version
