"""Which learner forward is fastest on this machine: the full-logits path, the LM head on scored rows
only, and that plus the shared prompt prefix run once (``step.output_logprobs``), each forward +
backward of one micro-batch of the learner, side by side in one process, on ``train.device`` in
``train.precision``. The head-only and shared-prefix paths were measured to pay on 2 CPU cores;
on an H200 bench/train.py's lean floor ran at half the plain loop's speed, and this says which part.

    .venv/bin/python bench/train_forward.py

Last line: ``lean_vs_full_forward=<seconds of head-only + shared prefix / seconds of full logits>``
(below 1: the lean forward pays here).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.train import MICRO, behaviour_logprobs, make_turns  # noqa: E402
from pipelines.config.train import TrainConfig  # noqa: E402
from pipelines.models.smollm2 import ensure_smollm2  # noqa: E402
from pipelines.train.batch import collate, encode_turns  # noqa: E402
from pipelines.train.device import place  # noqa: E402
from pipelines.train.step import build_policy, micro_batch_key, output_logprobs  # noqa: E402

REPEATS = 10


def main() -> None:
    import torch

    base = Path(os.environ["TRACERL_BENCH_BASE"]) if os.environ.get("TRACERL_BENCH_BASE") else \
        ensure_smollm2(Path(".tracerl"))
    cfg = TrainConfig(base_model=str(base))
    placement = place(cfg)
    model, tok = build_policy(base, None, cfg, seed=0)
    model.to(placement.device)
    enc, _ = encode_turns(behaviour_logprobs(base, make_turns(tok))[:MICRO], tok)
    b = collate(sorted(enc, key=micro_batch_key), tok.pad_token_id).to(placement.device)
    print(f"{placement}; micro-batch {MICRO} rows x {b.input_ids.shape[1]} positions")

    def sync() -> None:
        if placement.device == "cuda":
            torch.cuda.synchronize()

    def run(**kw) -> float:
        best = float("inf")
        for _ in range(REPEATS):
            model.zero_grad(set_to_none=True)
            sync()
            t0 = time.perf_counter()
            with placement.autocast():
                lp = output_logprobs(model, b.input_ids, b.attention_mask, b.loss_mask, **kw)
            lp.sum().backward()
            sync()
            best = min(best, time.perf_counter() - t0)
        return best

    paths = {"full logits": dict(head_only_where_scored=False), "head on scored rows": dict(prefix=0),
             "head on scored rows + shared prefix": dict()}
    for kw in paths.values():
        run(**kw)  # warm-up of each path
    times = {name: run(**kw) for name, kw in paths.items()}
    for name, s in times.items():
        print(f"{name}: {s * 1000:.1f} ms (best of {REPEATS}, forward + backward)")
    print(f"lean_vs_full_forward={times['head on scored rows + shared prefix'] / times['full logits']:.2f}")


if __name__ == "__main__":
    main()
