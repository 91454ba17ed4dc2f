"""`make demo`: the closed loop on SmolLM2-135M-Instruct, on this machine, in one command.

Starts the embedded Kafka, vLLM (CPU) and the gateway; bootstraps the first champion;
then K times: simulated users -> ingest -> rewards -> learner -> gate -> hot swap; then
one more round of traffic on the last champion, a report, PNG plots, and an MLflow run
with all of it. The state lives in the tracerl home (`.tracerl/`), so `make up`
afterwards shows the runs, the registry and its champion in the MLflow UI. A second run
continues from the champion the first one left (`--fresh` clears the loop's state first).
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import asdict

from pipelines.config import TracerlConfig
from pipelines.loop.run import LoopConfig, run_iteration
from pipelines.services import stack
from pipelines.sim.traffic import TrafficConfig

STATE = ("lake", "adapters", "deploy", "spill", "mlflow.db", "mlartifacts", "reports")  # not models/, not logs/


def fresh_start(cfg: TracerlConfig) -> None:
    """Stop what a previous run left and clear its state (the converted model stays cached)."""
    for name in reversed(stack.SERVICES):
        stack.stop(cfg, name)
    for name in STATE:
        p = cfg.home / name
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


class Bar:
    """A one-line progress bar on stderr (tqdm when it is installed)."""

    def __init__(self) -> None:
        self._bars: dict[str, object] = {}
        try:
            from tqdm import tqdm

            self._tqdm = tqdm
        except ImportError:
            self._tqdm = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self._tqdm is None:
            if done == total or done % max(1, total // 10) == 0:
                print(f"    {stage}: {done}/{total}", file=sys.stderr)
            return
        bar = self._bars.get(stage)
        if bar is None:
            bar = self._bars[stage] = self._tqdm(total=total, desc=f"    {stage}", leave=False, file=sys.stderr)
        bar.update(done - bar.n)  # type: ignore[attr-defined]
        if done >= total:
            bar.close()  # type: ignore[attr-defined]
            del self._bars[stage]


def run_loop(cfg: TracerlConfig, lc: LoopConfig, *, fresh: bool = False, stop_after: bool = True) -> dict:
    """Run the loop end to end; returns the figures `bench/loop.py` prints."""
    from pipelines.deploy.service import tenant_key
    from pipelines.loop.bootstrap import ensure_serving
    from pipelines.loop.report import format_report, log_to_mlflow, plot
    from pipelines.loop.run import _gateway
    from pipelines.sim.traffic import simulate

    t_start = time.monotonic()
    if fresh:
        fresh_start(cfg)
    tenant_key(cfg, lc.tenant)  # the simulated app's API key, before the gateway reads the key files
    print(f"[setup] base model {cfg.train.base_model}; state in {cfg.home.resolve()}", flush=True)
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
            print(f"[iteration {i}/{lc.iterations}] traffic -> ingest -> rewards -> train -> gate -> swap", flush=True)
            reports.append(run_iteration(cfg, lc, i, progress=bar, log=lambda s: print(s, flush=True)))
        print("[final] traffic on the last champion", flush=True)
        t = TrafficConfig(**{**asdict(lc.traffic), "tenant": lc.tenant, "task": lc.task,
                             "seed": lc.traffic.seed + lc.iterations + 1})
        final = simulate(_gateway(cfg), tenant_key(cfg, lc.tenant), t,
                         lc.preference(),
                         progress=lambda d, n: bar("traffic", d, n))
        final_version = int(max(final.versions, key=final.versions.get).lstrip("v")) if final.versions else None
        text = format_report(reports, final.reward, final_version)
        plots = plot(reports, final.reward, cfg.home / "reports")
        run_id = log_to_mlflow(cfg, reports, text, plots, {"loop": asdict(lc), "train": cfg.train.to_dict(),
                                                           "gate": cfg.gate.to_dict()}, final.reward)
        print(text)
        print(f"\nplots: {', '.join(str(p) for p in plots)} (also on MLflow run {run_id}, experiment "
              f"'{cfg.mlflow.experiment}')")
        print(f"total {time.monotonic() - t_start:.0f}s (setup {setup_s:.0f}s)")
        print("See it: `make up`, then MLflow http://127.0.0.1:5000 (models: "
              f"{lc.tenant}.{lc.task}, alias champion) and Dagster http://127.0.0.1:3000")
        return {"reports": reports, "final_reward": final.reward, "setup_s": setup_s,
                "total_s": time.monotonic() - t_start}
    finally:
        if stop_after:
            for name in reversed(started):
                stack.stop(cfg, name)


def main(cfg: TracerlConfig, iterations: int = 3, fresh: bool = False, keep: bool = False) -> int:
    run_loop(cfg, LoopConfig(iterations=iterations), fresh=fresh, stop_after=not keep)
    return 0
