"""The learner against a peer, side by side in one process: TRL's GRPO loss vs ``train_step``.

Same base and LoRA model (``build_policy``: SmolLM2-135M-Instruct, r=16 on q/k/v/o), the same 64
turns x 128 output tokens with behaviour logprobs (bench/train.py's), the same micro-batches of
8, 2 AdamW steps, the same importance correction and KL coefficient:
  learner: ``train_step`` (defaults: truncated IS min(rho, 2) against the logged behaviour
           logprobs, k3 KL to the adapter-disabled base, kl_coef 0.02);
  TRL:     ``GRPOTrainer._compute_loss`` (TRL 1.16, ``loss_type="bnpo"``: token-mean, like ours)
           with its vLLM importance-sampling correction (``token_truncate``, clip 2.0: the same
           min(rho, 2) with rho = pi_old / q) and ``beta`` = kl_coef, fed the inputs its trainer
           builds before the loss: the reference logps (adapter disabled) and, as TRL computes
           them whenever that correction is on, the old-policy logps; both with TRL's own
           ``_get_per_token_logps_and_entropies`` (its fused LM head). Then backward and
           AdamW, as in its ``training_step``.
Model loading and trainer construction are outside the timing, like bench/train.py's floors.

    .venv/bin/python bench/train_vs_trl.py

Prints both tokens/s and, last, ``learner_vs_trl_tokens_per_s=<learner / TRL>`` (target >= 1.3).
The line before it gives the ratio against TRL without the old-policy forward (what TRL would
cost if it reused the policy forward, as it does without vLLM).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.train import MICRO, STEPS, behaviour_logprobs, make_turns  # noqa: E402
from pipelines.config.train import OptimizerSettings, TrainConfig  # noqa: E402
from pipelines.models.smollm2 import ensure_smollm2  # noqa: E402
from pipelines.train.batch import encode_turns  # noqa: E402
from pipelines.train.device import place  # noqa: E402
from pipelines.train.step import build_policy, train_step  # noqa: E402


def _zero_reward(prompts, completions, **_):
    return [0.0] * len(prompts)


def trl_inputs(micro, pad_id: int, device):
    """TRL's batch layout: prompts left-padded, completions right-padded, plus the logged logps."""
    import torch

    P = max(len(e.prompt_ids) for e in micro)
    C = max(len(e.output_ids) for e in micro)
    prompt_ids = torch.full((len(micro), P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(micro), P), dtype=torch.long)
    completion_ids = torch.full((len(micro), C), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((len(micro), C), dtype=torch.long)
    sampling = torch.zeros((len(micro), C))
    for i, e in enumerate(micro):
        p, o = e.prompt_ids, e.output_ids
        prompt_ids[i, P - len(p):], prompt_mask[i, P - len(p):] = torch.tensor(p), 1
        completion_ids[i, :len(o)], completion_mask[i, :len(o)] = torch.tensor(o), 1
        sampling[i, :len(o)] = torch.tensor(e.behaviour or [0.0] * len(o))
    advantages = torch.tensor([e.turn.reward for e in micro], dtype=torch.float32)
    out = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
               completion_mask=completion_mask, advantages=advantages, sampling_per_token_logps=sampling)
    return {k: v.to(device) for k, v in out.items()}


def trl_run(base: Path, cfg: TrainConfig, turns, with_old: bool = True) -> tuple[float, int]:
    """Seconds and tokens of STEPS optimizer steps of TRL's GRPO loss on ``turns``."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    placement = place(cfg)
    model, tok = build_policy(base, None, cfg, seed=0)
    model.to(placement.device)
    obj = cfg.objective
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, report_to="none", per_device_train_batch_size=MICRO, num_generations=4,
                          max_completion_length=max(len(t.output_token_ids) for t in turns), loss_type="bnpo",
                          beta=obj.kl_coef, vllm_importance_sampling_mode="token_truncate",
                          vllm_importance_sampling_clip_max=obj.tis_cap, use_cpu=placement.device == "cpu",
                          bf16=placement.precision == "bf16", logging_steps=10 ** 6)
        trainer = GRPOTrainer(model=model, reward_funcs=_zero_reward, args=args, processing_class=tok,
                              train_dataset=Dataset.from_dict({"prompt": ["x"] * MICRO}))
    # what its trainer sets up with vLLM serving (no server here: the logged logps stand in for vLLM's)
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    model.train()
    encoded, _ = encode_turns(turns, tok)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.optimizer.lr)
    per_step = len(encoded) // STEPS
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def logps(ids, mask, keep):
        return trainer._get_per_token_logps_and_entropies(model, ids, mask, keep)[0]

    t0, tokens = time.perf_counter(), 0
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step = encoded[s * per_step:(s + 1) * per_step]
        for i in range(0, len(step), MICRO):
            inputs = trl_inputs(step[i:i + MICRO], pad, placement.device)
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
            keep = inputs["completion_ids"].shape[1]
            with torch.no_grad():
                old = logps(ids, mask, keep) if with_old else None
                with model.disable_adapter():
                    inputs["ref_per_token_logps"] = logps(ids, mask, keep)
            inputs["old_per_token_logps"] = old
            q = inputs["sampling_per_token_logps"]
            ratio = torch.exp((old if old is not None else inputs["ref_per_token_logps"]) - q)
            inputs["importance_sampling_ratio"] = torch.clamp(ratio, max=obj.tis_cap)
            inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
            if old is None:
                inputs.pop("old_per_token_logps")
            loss = trainer.compute_loss(model, inputs)
            if not torch.isfinite(loss):
                raise RuntimeError(f"TRL's loss is {float(loss)}: the inputs are not what its trainer builds")
            loss.backward()
            tokens += int(inputs["completion_mask"].sum())
        torch.nn.utils.clip_grad_norm_(params, cfg.optimizer.grad_clip)
        opt.step()
    if placement.device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, tokens


def learner_run(base: Path, cfg: TrainConfig, turns) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        r = train_step(base, None, turns, cfg, Path(tmp) / "adapter", seed=0)
    return sum(s["step_s"] for s in r.steps), int(sum(s["tokens"] for s in r.steps))


def main() -> None:
    from importlib.metadata import version

    from transformers import AutoTokenizer

    base = Path(os.environ["TRACERL_BENCH_BASE"]) if os.environ.get("TRACERL_BENCH_BASE") else \
        ensure_smollm2(Path(".tracerl"))
    tok = AutoTokenizer.from_pretrained(base)
    turns = behaviour_logprobs(base, make_turns(tok))
    cfg = TrainConfig(base_model=str(base), optimizer=OptimizerSettings(
        lr=1e-4, steps_per_iteration=STEPS, micro_batch_size=MICRO))
    print(f"base {base}; trl {version('trl')}, transformers {version('transformers')}; {place(cfg)}")
    warm = turns[:MICRO * STEPS]
    trl_run(base, cfg, warm)
    learner_run(base, cfg, warm)
    results = {}
    for name, run in (("learner", lambda: learner_run(base, cfg, turns)),
                      ("TRL GRPO", lambda: trl_run(base, cfg, turns)),
                      ("TRL GRPO without the old-policy forward", lambda: trl_run(base, cfg, turns, with_old=False))):
        s, n = run()
        results[name] = n / s
        print(f"{name}: {n} tokens in {s:.1f}s = {n / s:.0f} tokens/s")
    print(f"learner_vs_trl_without_old_forward={results['learner'] / results['TRL GRPO without the old-policy forward']:.2f}")
    print(f"learner_vs_trl_tokens_per_s={results['learner'] / results['TRL GRPO']:.2f}")


if __name__ == "__main__":
    main()
