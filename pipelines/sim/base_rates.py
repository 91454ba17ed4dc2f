"""Measure each family's base rate: the share of liked replies a model gives on held-out prompts.

    python -m pipelines.sim.base_rates --model smollm2 --samples 4 --max-new-tokens 48

Sampling is the loop's (T=1, top_p 1, top_k off); the tools family's prompts carry its tools
exactly as the gateway renders them (`with_tools`). `--dump` writes every sampled reply to JSON
so that a rule can be re-tuned without sampling again.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable

from pipelines.sim.families import Reply, families, model_input


def measure(policy, names: list[str], samples: int, max_new_tokens: int, seed: int = 0,
            batch: int = 64, done: Callable[[str, dict], None] | None = None) -> dict[str, dict]:
    """{family: {rate, liked, n, prompts, seconds, replies}}; `done(name, result)` after each family."""
    out = {}
    for name in names:
        fam = families()[name]
        held = fam.prompts("heldout")
        per = max(1, batch // samples)
        replies: list[Reply] = []
        t0 = time.monotonic()
        for i in range(0, len(held), per):
            chunk = [model_input(fam, m) for m in held[i:i + per]]
            for m, group in zip(chunk, policy.sample(chunk, samples, max_new_tokens, seed=seed + i)):
                prefix = m[-1]["content"] if m[-1]["role"] == "assistant" else ""  # a forced call's opening
                replies += [Reply(prefix + s.text, s.tokens, s.finish_reason) for s in group]
        liked = [fam.liked(r) for r in replies]
        out[name] = {"rate": sum(liked) / len(liked), "liked": sum(liked), "n": len(liked),
                     "prompts": len(held), "seconds": round(time.monotonic() - t0, 1),
                     "replies": [{"text": r.text, "tokens": r.tokens, "finish_reason": r.finish_reason,
                                  "liked": k} for r, k in zip(replies, liked)]}
        if done:
            done(name, out[name])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | a model folder")
    ap.add_argument("--families", default=",".join(families()))
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--home", default=".tracerl")
    ap.add_argument("--dump", default=None)
    args = ap.parse_args()

    from pipelines.sim.policy import HFPolicy

    if args.model == "smollm2":
        from pipelines.models.smollm2 import ensure_smollm2

        base = ensure_smollm2(Path(args.home))
    else:
        from pipelines.models.registry import resolve_base_model

        base = resolve_base_model(args.model, Path(args.home))
    res: dict[str, dict] = {}

    def done(name: str, r: dict) -> None:
        res[name] = r
        print(f"{args.model} {name:9s} base rate {r['rate']:.3f} ({r['liked']}/{r['n']}, "
              f"{r['prompts']} held-out prompts x {args.samples}, {r['seconds']}s)", flush=True)
        if args.dump:
            Path(args.dump).write_text(json.dumps(res, indent=1))

    measure(HFPolicy(base), args.families.split(","), args.samples, args.max_new_tokens, done=done)


if __name__ == "__main__":
    main()
