"""AdamW state beside the adapter, so a training branch continues where its last step stopped.

Saved as ``optimizer.safetensors`` (not ``torch.save``'s pickle ``optimizer.pt``): the deployer
refuses any pickle in an adapter folder (``*.pt``, ``*.bin``: loading one can run code), and
vLLM reads only ``adapter_model.safetensors``, so the folder stays servable as it is. Tensors are
``state.<param index>.<key>`` (``step``, ``exp_avg``, ``exp_avg_sq``); the param groups and any
non-tensor state go in the header metadata as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

OPTIMIZER_FILE = "optimizer.safetensors"


def save_optimizer_state(optimizer, path: Path) -> Path:
    """Write ``optimizer.state_dict()`` to ``path`` (a safetensors file)."""
    from safetensors.torch import save_file

    sd = optimizer.state_dict()
    tensors, extra = {}, {}
    for i, st in sd["state"].items():
        for k, v in st.items():
            if hasattr(v, "shape"):
                tensors[f"state.{i}.{k}"] = v.detach().contiguous().cpu()
            else:
                extra[f"{i}.{k}"] = v
    meta = {"format": "tracerl.adamw.v1", "param_groups": json.dumps(sd["param_groups"]),
            "extra": json.dumps(extra)}
    save_file(tensors, str(path), metadata=meta)
    return Path(path)


def load_optimizer_state(optimizer, path: Path) -> int:
    """Load the state saved by :func:`save_optimizer_state` into ``optimizer``; returns the step
    count it continues from. Hyperparameters (lr, betas, weight decay) stay the optimizer's own:
    the config of this run wins over the one the state was saved under.

    Raises ``ValueError`` when the state does not fit the optimizer's parameters (another LoRA
    shape or target set): AdamW moments belong to one parameter each, so nothing can be reused.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"optimizer state {path} does not exist; pass None to start a fresh AdamW")
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    if meta.get("format") != "tracerl.adamw.v1":
        raise ValueError(f"{path} is not an optimizer state written by tracerl (format={meta.get('format')!r})")
    saved_groups = json.loads(meta["param_groups"])
    state: dict[int, dict] = {}
    for name, t in tensors.items():
        _, i, k = name.split(".", 2)
        state.setdefault(int(i), {})[k] = t
    for key, v in json.loads(meta.get("extra", "{}")).items():
        i, k = key.split(".", 1)
        state.setdefault(int(i), {})[k] = v
    params = [p for g in optimizer.param_groups for p in g["params"]]
    n_saved = sum(len(g["params"]) for g in saved_groups)
    if n_saved != len(params) or len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(f"{path} holds AdamW state for {n_saved} parameters in {len(saved_groups)} group(s), "
                         f"the optimizer has {len(params)} in {len(optimizer.param_groups)}: the adapter's LoRA "
                         f"shape changed; start a fresh optimizer (reset the branch)")
    for i, st in state.items():
        for k, t in st.items():
            if k != "step" and hasattr(t, "shape") and tuple(t.shape) != tuple(params[i].shape):
                raise ValueError(f"{path}: state {k} of parameter {i} has shape {tuple(t.shape)}, the parameter "
                                 f"{tuple(params[i].shape)}: the adapter's LoRA shape changed; start a fresh "
                                 f"optimizer (reset the branch)")
    own = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    optimizer.load_state_dict({"state": state, "param_groups": saved_groups})
    for g, hp in zip(optimizer.param_groups, own):
        g.update(hp)
    steps = [float(st["step"]) for st in state.values() if "step" in st]
    return int(max(steps)) if steps else 0
