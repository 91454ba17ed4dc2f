"""Does the loop learn what users want when they say it rarely? Every family, SmolLM2, the real path.

For each hidden-preference family of simulated users (pipelines/sim/families.py: a length
format, a follow-up question, a concrete fact, valid tool calls through the OpenAI `tools`
API, a greeting style), its own task starts from the base model (champion v1) and runs
ITERATIONS turns of the loop exactly as the product runs them: simulated users -> gateway ->
vLLM, then one in-process run of the closed-loop Dagster job (assets/loop.py, the one driver):
Kafka -> lake -> rewards -> learner -> gate (private evals in vLLM) -> hot swap in `deployment`. Shipped defaults (TracerlConfig()), only ports and the home
differ. Users vote explicitly on 20% of turns and leave implicit signals on the rest.

Before the first and after every iteration: the served rate on held-out prompts (topics the
traffic never uses) of the champion as vLLM serves it, ± its standard error clustered by
prompt (pipelines/loop/heldout.py), and the gate's decision.

    .venv/bin/python bench/learn.py
    TRACERL_LEARN_FAMILIES=followup,tools TRACERL_LEARN_ITERATIONS=2 .venv/bin/python bench/learn.py

Target for every family: after the last iteration, served rate >= base + 0.15 and at least
3 standard errors above base. Last line: learn_min_gain=<smallest (after - base) over families>.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loop import bench_home, drop_home  # noqa: E402

ITERATIONS = int(os.environ.get("TRACERL_LEARN_ITERATIONS", "5"))
FAMILIES = [f for f in os.environ.get("TRACERL_LEARN_FAMILIES", "").split(",") if f]
EXPLICIT_RATE = 0.2
SAMPLES = 4  # per held-out prompt


def main() -> None:
    from assets.demo import demo_iteration, demo_resource
    from assets.driver import dagster_instance
    from assets.resources import TracerlResource
    from pipelines.adapters import registry
    from pipelines.config import load_config
    from pipelines.deploy.service import tenant_key
    from pipelines.deploy.vllm_server import read_state
    from pipelines.loop.bootstrap import ensure_serving
    from pipelines.loop.demo import LoopConfig
    from pipelines.loop.heldout import adapter_rate
    from pipelines import stack
    from pipelines.sim.families import families
    from pipelines.sim.traffic import TrafficConfig
    from pipelines.adapters.store import AdapterStore

    home, toml = bench_home("tracerl-learn-", 19492)
    cfg, instance = load_config(toml), dagster_instance()
    # checked against cfg now, before anything exports MLFLOW_TRACKING_URI into this process
    resource = demo_resource(TracerlResource(config_path=str(toml)), cfg, LoopConfig())
    names = FAMILIES or list(families())
    rows: dict[str, list] = {}
    tenant_key(cfg, "acme")  # the simulated app's API key, before the gateway reads the key files
    try:
        for name in stack.SERVE:
            print(f"[setup] {name}: {stack.start(cfg, name)}", flush=True)
        vllm = read_state(cfg.home).base_url
        store = AdapterStore(cfg.adapter_root)
        for name in names:
            fam = families()[name]
            lc = LoopConfig(task=fam.task, iterations=ITERATIONS,
                            traffic=TrafficConfig(task=fam.task, explicit_rate=EXPLICIT_RATE))
            v = ensure_serving(cfg, lc.tenant, fam.task)

            def rate(version: int, tag: str):
                path = store.get(lc.tenant, fam.task, version).path
                return adapter_rate(vllm, path, fam, f"learn.{fam.task}.{tag}.v{version}", samples=SAMPLES,
                                    max_tokens=lc.traffic.max_tokens, seed=0)

            base = rate(v, "before")
            print(f"[{name}] iteration 0: champion v{v}, held-out served rate {base}", flush=True)
            rows[name] = [(0, base, "", 0.0)]
            for i in range(1, ITERATIONS + 1):
                t0 = time.monotonic()
                rep = demo_iteration(cfg, resource, lc, i, instance, log=lambda s: print(f"[{name}] {s}", flush=True))
                champ = registry.adapter_for_alias(cfg, lc.tenant, fam.task, registry.CHAMPION)
                r = rate(champ, f"it{i}")
                wall = time.monotonic() - t0
                rows[name].append((i, r, f"{rep.outcome} v{rep.candidate}" if rep.candidate else rep.outcome, wall))
                stages = ", ".join(f"{k} {v:.0f}s" for k, v in rep.stage_s.items())
                print(f"[{name}] iteration {i}: live {rep.live_reward:.3f}, gate {rep.outcome}, champion v{champ}, "
                      f"held-out served rate {r} ({wall:.0f}s: {stages})", flush=True)
    finally:
        for name in reversed(stack.SERVE):
            stack.stop(cfg, name)
        drop_home(home)

    print("\nfamily     iteration  served rate (± SE, clustered by prompt)  gate            seconds")
    gains = {}
    for name, rs in rows.items():
        for i, r, gate, wall in rs:
            print(f"{name:<10} {i:>9}  {str(r):<40} {gate:<15} {wall:>7.0f}")
        base, last = rs[0][1], rs[-1][1]
        gains[name] = last.rate - base.rate
        se = (base.se ** 2 + last.se ** 2) ** 0.5
        ok = gains[name] >= 0.15 and gains[name] >= 3 * se
        print(f"{name:<10} gain {gains[name]:+.3f} ({gains[name] / se if se else float('nan'):.1f} SE): "
              f"{'meets' if ok else 'misses'} the target (>= +0.15 and >= 3 SE)")
    print(f"learn_min_gain={min(gains.values()):.3f}" if gains else "learn_min_gain=nan")


if __name__ == "__main__":
    main()
