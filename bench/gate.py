"""Wall time of one gate pass: 200 items, candidate vs champion, SmolLM2-135M-Instruct on vLLM (CPU fp32).

Builds two random LoRA adapters (r=8, q/k/v/o) on SmolLM2, publishes them to an adapter store,
registers them in an embedded MLflow (SQLite, temp folder), makes the first the champion, starts
(or reuses) vLLM with both, and times ``run_gate`` on the second: 2 x 200 greedy completions,
scoring, a paired bootstrap, the MLflow run, tags and the plot.

    .venv/bin/python bench/gate.py [--items 200] [--max-tokens 48] [--concurrency 16]
Last line: gate_wall_s=<seconds> items=<n>
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def items(n: int) -> list[dict]:
    from pipelines.sim.env import TEMPLATES, TOPICS

    lead = ["", "Please answer in one sentence. ", "Be brief. ", "Quick question: "]
    out = [{"messages": [{"role": "user", "content": f"{pre}{t.format(topic)}"}]}
           for pre in lead for topic in TOPICS for t in TEMPLATES]
    if n > len(out):
        raise SystemExit(f"--items {n}: at most {len(out)} distinct prompts here")
    return out[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()

    import mlflow

    from pipelines.adapters import registry
    from pipelines import tracking
    from pipelines.config import TracerlConfig
    from pipelines.deploy.vllm_server import start_vllm, stop_vllm
    from pipelines.config.gate import GateConfig
    from pipelines.gate.evaluate import VllmBackend
    from pipelines.gate.run import run_gate
    from pipelines.models.smollm2 import ensure_smollm2
    from pipelines.adapters.store import AdapterStore
    from tests.deploy.test_vllm import make_adapter

    root = Path(tempfile.mkdtemp(prefix="tracerl-bench-gate-"))
    cfg = TracerlConfig(home=root / "home")
    base = ensure_smollm2(Path(".tracerl"))  # the converted model is cached under ./.tracerl
    tenant, task = "bench", "gate"
    folder = root / "evals" / tenant / task
    folder.mkdir(parents=True)
    (folder / "finish.toml").write_text(
        'role = "primary"\n[scorer]\nkind = "rubric"\n'
        '[[scorer.criteria]]\nweight = 1\ncheck = { kind = "regex", pattern = \'\\.\\s*$\' }\n'
        '[[scorer.criteria]]\nweight = 1\ncheck = { kind = "regex", pattern = \'^.{20,}\' }\n')
    (folder / "finish.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items(args.items)))

    versions = []
    for seed in (1, 2):
        src = make_adapter(base, root / f"src{seed}", r=8, seed=seed, scale=0.02)
        av = AdapterStore(cfg.adapter_root).publish(tenant, task, src, {
            "parent_version": versions[-1][1] if versions else None, "base_model_hash": "bench",
            "data_window": {}, "reward_spec_version": [], "config": {}, "metrics": {}})
        with tracking.run(cfg, "bench learner", tags={}, params={}) as run:
            mlflow.log_artifacts(str(av.path), "adapter")
        versions.append((registry.register_candidate(cfg, tenant, task, run.info.run_id, av.version, {}), av.version))
    registry.set_alias(cfg, tenant, task, registry.CHAMPION, versions[0][0])

    t0 = time.monotonic()
    state = start_vllm(base, home=cfg.home, port=None, max_loras=2, max_lora_rank=8, max_cpu_loras=4,
                       dtype="float32", max_model_len=1024, start_timeout_s=600)
    print(f"vLLM up in {time.monotonic() - t0:.1f}s on {state.base_url}")
    gate = GateConfig(suites_dir=str(root / "evals"), max_tokens=args.max_tokens, concurrency=args.concurrency)
    try:
        t1 = time.monotonic()
        r = run_gate(cfg, tenant, task, versions[1][0], backend=VllmBackend(state.base_url), gate=gate,
                     training_prompts=[])
        wall = time.monotonic() - t1
    finally:
        stop_vllm(cfg.home)
    print(f"decision: {r.decision.outcome}; " + "; ".join(r.decision.reasons))
    print(f"completions: {2 * r.items} x <= {args.max_tokens} tokens, concurrency {args.concurrency}")
    print(f"gate_wall_s={wall:.1f} items={r.items}")


if __name__ == "__main__":
    main()
