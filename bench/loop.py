"""The closed loop on SmolLM2-135M-Instruct, 3 iterations, timed per stage.

Everything real and local: embedded Kafka, vLLM on CPU with LoRA, the gateway, the
simulated users, and each iteration one in-process run of the closed-loop Dagster job
(exactly-once ingest, rewards, the learner, the gate with private evals in vLLM, the hot swap
in `deployment`), exactly what `make demo` runs. A fresh tracerl home in a temp folder (the
converted model is shared with ./.tracerl/models) with its own tracerl.toml, ports and Dagster
instance; everything it starts is stopped at the end.

    .venv/bin/python bench/loop.py
Last line: freshness_s=<mean seconds from the first trace of an iteration to an adapter
trained on it serving traffic>. Target: each iteration under 300 s on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.loop.demo import LoopConfig  # noqa: E402
from pipelines.sim.evals import write_suites  # noqa: E402
from pipelines.loop.report import STAGES  # noqa: E402
from pipelines.models.smollm2 import ensure_smollm2  # noqa: E402


def bench_home(prefix: str, kafka_port: int) -> tuple[Path, Path]:
    """A fresh tracerl home with its own tracerl.toml (its ports), and a Dagster instance inside it.

    The settings live in the file, not in memory: the loop's Dagster runs and the gateway process
    load them from there (TRACERL_CONFIG), as they would in production."""
    cache = Path(".tracerl").resolve()
    ensure_smollm2(cache)
    home = Path(tempfile.mkdtemp(prefix=prefix))
    (home / "models").symlink_to(cache / "models")
    toml = home / "tracerl.toml"
    suites = write_suites(home / "evals")  # the simulated tenant's private evals (pipelines/sim/evals.py)
    toml.write_text(f'home = "{home}"\n[kafka]\nembedded_port = {kafka_port}\n[gateway]\nport = 0\n'
                    f'[gate]\nsuites_dir = "{suites}"\n')
    os.environ["TRACERL_CONFIG"] = str(toml)
    dagster_home = home / "dagster_home"
    dagster_home.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "dagster_home" / "dagster.yaml", dagster_home)
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    return home, toml


def drop_home(home: Path) -> None:
    """Remove a bench's home, unless the bench is failing: then its logs (vLLM, gateway, Kafka)
    are what tell why, so it is kept and named."""
    if sys.exc_info()[0] is not None:
        print(f"[bench] failed: kept {home} (logs in {home / 'logs'})", file=sys.stderr, flush=True)
        return
    shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    from assets.demo import run_demo
    from assets.resources import TracerlResource
    from pipelines.config import load_config

    home, toml = bench_home("tracerl-loop-", 19392)
    try:
        out = run_demo(load_config(toml), LoopConfig(iterations=3), resource=TracerlResource(config_path=str(toml)),
                       fresh=False, stop_after=True)
    finally:
        drop_home(home)
    reports = out["reports"]
    print(f"\nsetup (services + first champion): {out['setup_s']:.0f}s")
    # outside: freshness minus the stages' own seconds, i.e. what the driver (Dagster run start,
    # step hand-offs, waiting for sessions to settle) adds on top of the work
    print("iteration  " + "  ".join(f"{s:>8}" for s in STAGES) + "     total   outside  live_reward  outcome")
    per_iter = []
    for r in reports:
        total = sum(r.stage_s.values())
        per_iter.append(total)
        outside = f"{r.freshness_s - total:>8.1f}" if r.freshness_s is not None else f"{'-':>8}"
        print(f"{r.iteration:>9}  " + "  ".join(f"{r.stage_s.get(s, 0):>8.1f}" for s in STAGES)
              + f"  {total:>8.1f}  {outside}  {r.live_reward:>11.3f}  {r.outcome}")
    print(f"after the loop: live reward {out['final_reward']:.3f}")
    print(f"seconds per iteration: max {max(per_iter):.0f} (target < 300)")
    fresh = [r.freshness_s for r in reports if r.freshness_s is not None]
    print(f"freshness_s={statistics.mean(fresh):.1f}" if fresh else "freshness_s=nan (no candidate was promoted)")


if __name__ == "__main__":
    main()
