"""`make demo`: the closed loop on SmolLM2-135M-Instruct, on this machine, in one command.

Starts the embedded Kafka, vLLM (CPU) and the gateway; bootstraps the first champion; then K
times: simulated users send traffic through the gateway, and one run of `closed_loop_job` for
the target turns it into a candidate, a gate decision and, on a promotion, a hot swap (in the
`deployment` asset) while swap-probe users keep sending requests. Then one more round of traffic
on the last champion, a report, PNG plots and an MLflow run with all of it.

The demo adds only traffic and a report around the job: every figure of an iteration (stage
seconds, candidate, gate outcome and eval scores, the swap) is read from its Dagster run, which
lands in the persistent instance (DAGSTER_HOME), so `make dagster` shows one run per iteration and
every asset materialized.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import dagster as dg

from assets.driver import LoopRun, dagster_instance, run_iteration
from assets.gate import primary_eval
from assets.resources import TracerlResource
from pipelines import stack
from pipelines.adapters.version import label
from pipelines.config import TracerlConfig
from pipelines.loop.demo import Bar, LoopConfig, fresh_start
from pipelines.loop.report import IterationReport

# The job's steps as the report's stages (the observation of the topic is part of ingest).
STEP_STAGE = {"raw_events": "ingest", "lake_events": "ingest", "turn_rewards": "rewards",
              "candidate_adapter": "train", "promotion": "gate", "deployment": "swap"}
TRAIN_METRICS = ("loss", "kl", "reward_mean", "clip_frac", "tokens_per_s")


def iteration_report(i: int, champion_before: int, stats: Any, traffic_s: float, run: LoopRun,
                     probe: Any, champion_after: int | None) -> IterationReport:
    """The report row of one iteration: its traffic, and what its Dagster run recorded."""
    r = IterationReport(i, champion_before, stats.reward, stats.requests, stats.failed, run_id=run.run_id,
                        outcome=run.outcome, champion_after=champion_after)
    r.stage_s = {"traffic": round(traffic_s, 1)}
    for step, seconds in run.stage_s.items():
        stage = STEP_STAGE.get(step, step)
        r.stage_s[stage] = round(r.stage_s.get(stage, 0.0) + seconds, 1)
    if run.candidate:
        r.candidate = int(run.candidate["adapter_version"])
        r.train_metrics = {k: run.candidate[k] for k in TRAIN_METRICS if k in run.candidate}
    if run.promotion:
        r.reasons = run.reasons
        r.eval_candidate, r.eval_champion = primary_eval(run.promotion)
    elif run.error:
        r.reasons = [run.error]
    elif run.skip_reason:
        r.reasons = [run.skip_reason]
    if run.deployment and run.deployment.get("swapped"):
        r.swap_requests, r.swap_failed = probe.requests, probe.failed
        r.freshness_s = round(run.step_end["deployment"] - stats.started_at, 1)
    return r


def demo_resource(resource: TracerlResource, cfg: TracerlConfig, lc: LoopConfig) -> TracerlResource:
    """`resource` (checked to load `cfg`) with the simulated users' reward spec as `reward.spec`: the
    demo's traffic is theirs, so their spec scores it (per-target entries in tracerl.toml still win)."""
    from assets.driver import check_resource

    check_resource(resource, cfg)
    return TracerlResource(config_path=resource.config_path, home=resource.home, reward_spec=lc.reward_spec)


def sim_suite(cfg: TracerlConfig, tenant: str, task: str) -> Path | None:
    """The simulated family's eval suite for tenant/task, written into the target's
    ``gate.suites_dir`` when it has none there (a checkout ships none: pipelines/sim/evals.py
    makes them); the folder written, or None."""
    from pipelines.config import gate_config
    from pipelines.sim.evals import ensure_suite

    return ensure_suite(gate_config(cfg.for_target(tenant, task)).suites_dir, tenant, task)


def demo_iteration(cfg: TracerlConfig, resource: TracerlResource, lc: LoopConfig, i: int,
                   instance: dg.DagsterInstance, progress: Callable[[str, int, int], None] | None = None,
                   log: Callable[[str], None] = print) -> IterationReport:
    """Traffic for the target, then one run of the loop job for it; the iteration's report row.

    `resource` is what the run loads its settings from (`demo_resource`: the simulated users' reward spec)."""
    from pipelines.adapters import registry
    from pipelines.deploy.service import tenant_key
    from pipelines.loop.traffic import SwapProbe, gateway_url, wait_emitted
    from pipelines.sim.traffic import simulate

    written = sim_suite(cfg, lc.tenant, lc.task)  # the gate's private eval: the simulator's, unless one is there
    if written is not None:
        log(f"  evals:   the simulated users' private eval written to {written}/ (pipelines/sim/evals.py)")
    url, key, pref = gateway_url(cfg), tenant_key(cfg, lc.tenant), lc.preference()
    champion = registry.adapter_for_alias(cfg, lc.tenant, lc.task, registry.CHAMPION) or 0
    t, t0 = lc.traffic_for(i), time.monotonic()
    stats = simulate(url, key, t, pref, progress=(lambda d, n: progress("traffic", d, n)) if progress else None)
    wait_emitted(cfg, url)
    traffic_s = time.monotonic() - t0
    served = {label(v): n for v, n in sorted(stats.versions.items())}
    log(f"  traffic: {stats.requests} requests ({stats.failed} failed), live reward {stats.reward:.3f}, "
        f"served by {served}" + (f"; first error: {stats.errors[0][:300]}" if stats.errors else ""))
    probe = SwapProbe(url, key, t, pref, lc.swap_probe_users)
    run = run_iteration(resource, lc.tenant, lc.task, instance=instance, during={"deployment": probe},
                        tags={"tracerl/driver": "demo", "tracerl/iteration": str(i)})
    r = iteration_report(i, champion, stats, traffic_s, run, probe,
                         registry.adapter_for_alias(cfg, lc.tenant, lc.task, registry.CHAMPION))
    log(f"  dagster: run {run.run_id} ({'success' if run.success else 'FAILED'}), steps "
        + ", ".join(f"{s} {v:.0f}s" for s, v in run.stage_s.items()))
    if run.candidate:
        c = run.candidate
        log(f"  learner: v{c['adapter_version']} from v{c.get('parent_version')} on {c['turns']} turns "
            f"(kl {float(c.get('kl', float('nan'))):.4f})")
    log(f"  gate:    {r.outcome}: {'; '.join(r.reasons)[:300]}")
    if r.freshness_s is not None:
        d = run.deployment or {}
        log(f"  swap:    v{r.champion_before} -> v{r.champion_after} in {r.stage_s.get('swap', 0)}s; "
            f"{r.swap_requests} probe requests during it, {r.swap_failed} failed (the gateway's count, all "
            f"users: {d.get('failed_requests_during_swaps', 0)} failed of {d.get('requests_during_swaps', 0)}); "
            f"freshness {r.freshness_s}s")
    return r


def champion_samples(cfg: TracerlConfig, lc: LoopConfig, first: int) -> str:
    """The report's sample replies: the first and the last champion on a few held-out prompts
    (vLLM directly, under measurement-only names: nothing recorded as traffic)."""
    from pipelines.adapters import registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.deploy.vllm_server import read_state
    from pipelines.loop.heldout import format_samples, sample_replies

    last = registry.adapter_for_alias(cfg, lc.tenant, lc.task, registry.CHAMPION) or first
    store = AdapterStore(cfg.adapter_root)
    adapters = {f"{label(v)} ({which})": store.get(lc.tenant, lc.task, v).path
                for v, which in ((first, "first"), (last, "last")) if v and (which == "first" or v != first)}
    return format_samples(sample_replies(read_state(cfg.home).base_url, adapters, lc.preference(),
                                         max_tokens=lc.traffic.max_tokens))


def run_demo(cfg: TracerlConfig, lc: LoopConfig, *, resource: TracerlResource | None = None, fresh: bool = False,
             stop_after: bool = True, instance: dg.DagsterInstance | None = None) -> dict:
    """Run the loop end to end; returns the figures `bench/loop.py` prints.

    `resource` is how the job's runs load the settings (default: `TracerlResource(home=cfg.home)`,
    i.e. tracerl.toml / $TRACERL_CONFIG with this home); it must load exactly `cfg`. The runs score
    with the simulated users' reward spec (`lc.reward_spec`), set on the resource."""
    from pipelines.deploy.service import tenant_key
    from pipelines.loop.bootstrap import ensure_serving
    from pipelines.loop.report import format_report, log_to_mlflow, plot
    from pipelines.loop.traffic import gateway_url
    from pipelines.sim.traffic import simulate

    t_start = time.monotonic()
    resource = demo_resource(resource or TracerlResource(home=str(cfg.home)), cfg, lc)
    instance = instance or dagster_instance()
    if fresh:
        fresh_start(cfg)
    tenant_key(cfg, lc.tenant)  # the simulated app's API key, before the gateway reads the key files
    print(f"[setup] base model {cfg.train.base_model}; state in {cfg.home.resolve()}; "
          f"Dagster instance {instance.root_directory}", flush=True)
    started = []
    try:
        for name in stack.SERVE:
            t0 = time.monotonic()
            running = stack.status(cfg, name).startswith("running")
            print(f"[setup] {name}: {stack.start(cfg, name)} ({time.monotonic() - t0:.0f}s)", flush=True)
            if not running:
                started.append(name)  # stop only what this run started
        t0 = time.monotonic()
        v = ensure_serving(cfg, lc.tenant, lc.task)
        print(f"[setup] {lc.tenant}/{lc.task}: champion v{v} (a fresh LoRA: the base model) is serving "
              f"({time.monotonic() - t0:.0f}s)", flush=True)
        setup_s = time.monotonic() - t_start
        bar, reports = Bar(), []
        for i in range(1, lc.iterations + 1):
            print(f"[iteration {i}/{lc.iterations}] traffic, then Dagster {lc.tenant}/{lc.task}: "
                  "ingest -> rewards -> train -> gate -> deployment", flush=True)
            reports.append(demo_iteration(cfg, resource, lc, i, instance, progress=bar,
                                          log=lambda s: print(s, flush=True)))
        print("[final] traffic on the last champion", flush=True)
        final = simulate(gateway_url(cfg), tenant_key(cfg, lc.tenant), lc.traffic_for(lc.iterations + 1),
                         lc.preference(), progress=lambda d, n: bar("traffic", d, n))
        final_version = max(final.versions, key=final.versions.get) if final.versions else None
        text = format_report(reports, final.reward, final_version)
        if reports:
            text += "\n\n" + champion_samples(cfg, lc, reports[0].champion_before)
        plots = plot(reports, final.reward, cfg.home / "reports")
        run_id = log_to_mlflow(cfg, reports, text, plots, {"loop": asdict(lc), "train": cfg.train.to_dict(),
                                                           "gate": cfg.gate.to_dict()}, final.reward)
        print(text)
        print(f"\nplots: {', '.join(str(p) for p in plots)} (also on MLflow run {run_id}, experiment "
              f"'{cfg.mlflow.experiment}')")
        print(f"total {time.monotonic() - t_start:.0f}s (setup {setup_s:.0f}s)")
        print(f"See it: `make dagster` (http://127.0.0.1:3000: job closed_loop_job, partition "
              f"{lc.tenant}/{lc.task}, one run per iteration), and `make up` for MLflow http://127.0.0.1:5000 "
              f"(model {lc.tenant}.{lc.task}, alias champion)")
        return {"reports": reports, "final_reward": final.reward, "setup_s": setup_s, "report": text,
                "total_s": time.monotonic() - t_start}
    finally:
        if stop_after:
            for name in reversed(started):
                stack.stop(cfg, name)


def main(cfg: TracerlConfig, iterations: int = 3, fresh: bool = False, keep: bool = False) -> int:
    run_demo(cfg, LoopConfig(iterations=iterations), fresh=fresh, stop_after=not keep)
    return 0
