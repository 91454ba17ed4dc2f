"""Can SmolLM2 make the tools family's calls? Base rate with tool_choice named, "required", "auto".

The tools family (pipelines/sim/families.py) is learnable only if the base model sometimes makes
a valid call. This samples its held-out prompts as the gateway serves them: the tools rendered
into the prompt (`with_tools`) and, for a forced call ("named": the family's own tool_choice,
or "required"), the assistant turn prefilled with the opening of a call (`call_prefix`,
continued by vLLM: no guided decoding), the reply judged on prefix +
continuation by the family's own `liked`. SmolLM2-135M-Instruct on vLLM (CPU), T=1, top_p 1, a
fresh vLLM in a temp home, stopped at the end.

    .venv/bin/python bench/tool_choice.py                    # named, required, then auto
    .venv/bin/python bench/tool_choice.py required --samples 4 --dump replies.json

One line per choice: `tool_choice=<c>: <rate> ± <SE clustered by prompt> (<liked>/<n>)`, with how
many replies were well-formed calls and how many named one of the tools.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.contract.tool_calls import call_prefix, function_of, parse_tool_calls, with_tools  # noqa: E402
from pipelines.deploy import admin  # noqa: E402
from pipelines.deploy.vllm_server import start_vllm, stop_vllm  # noqa: E402
from pipelines.loop.heldout import clustered_rate  # noqa: E402
from pipelines.models.smollm2 import ensure_smollm2  # noqa: E402
from pipelines.sim.families import Reply, Tools  # noqa: E402


def measure(base_url: str, fam: Tools, choice: str, samples: int, max_tokens: int) -> tuple[str, list[dict]]:
    choice = fam.tool_choice if choice == "named" else choice  # named: the family's own (its forced tool)
    prefix = call_prefix(choice)
    prompts = [with_tools(m, list(fam.tools or ()), choice) for m in fam.prompts("heldout")]
    jobs = [(i, k) for i in range(len(prompts)) for k in range(samples)]

    def one(job: tuple[int, int]) -> dict:
        i, k = job
        seed = (zlib.crc32(repr(prompts[i]).encode()) + k * 7919) % (2 ** 31)
        out = admin.complete(base_url, "base", messages=prompts[i], max_tokens=max_tokens, temperature=1.0,
                             top_p=1.0, seed=seed, logprobs=False, return_token_ids=True, timeout=1800)
        text = out.reply  # a forced call's opening (continued by vLLM) and what was sampled
        return {"prompt": i, "text": text, "finish": out.finish_reason,
                "liked": bool(fam.liked(Reply(text, len(out.token_ids), out.finish_reason)))}

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(one, jobs))
    per: list[list[bool]] = [[] for _ in prompts]
    for r in replies:
        per[r["prompt"]].append(r["liked"])
    names = {function_of(t).get("name") for t in fam.tools or ()}
    calls = [parse_tool_calls(r["text"]).calls for r in replies]
    formed = sum(bool(c) and all(x.error is None for x in c) for c in calls)
    named = sum(any(x.name in names for x in c) for c in calls)
    return (f"tool_choice={choice}: {clustered_rate(per)}; well-formed calls {formed}/{len(replies)}, "
            f"naming one of the tools {named}/{len(replies)}"), replies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("choices", nargs="*", help='"named", "required" and/or "auto" (default: all three)')
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--dump", default=None, help="write every reply to this JSON file")
    args = ap.parse_args()
    args.choices = args.choices or ["named", "required", "auto"]
    if set(args.choices) - {"auto", "required", "named"}:
        ap.error(f"choices: use named, required and/or auto, got {args.choices}")
    base = ensure_smollm2(Path(".tracerl"))
    home = Path(tempfile.mkdtemp(prefix="tracerl-toolchoice-"))
    dump: dict[str, list[dict]] = {}
    try:
        state = start_vllm(base, home=home, port=None, start_timeout_s=900)
        for choice in args.choices:
            t0 = time.monotonic()
            line, dump[choice] = measure(state.base_url, Tools(), choice, args.samples, args.max_tokens)
            print(f"{line} ({time.monotonic() - t0:.0f}s)", flush=True)
            if args.dump:
                Path(args.dump).write_text(json.dumps(dump, indent=1))
    finally:
        stop_vllm(home)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
