"""The closed loop on SmolLM2-135M-Instruct, 3 iterations, timed per stage.

Everything real and local: embedded Kafka, vLLM on CPU with LoRA, the gateway, the
simulated users, exactly-once ingest, rewards, the learner, the gate (private evals in
vLLM) and the hot swap. A fresh tracerl home in a temp folder (the converted model is
shared with ./.tracerl/models), its own ports; everything it starts is stopped at the end.

    .venv/bin/python bench/loop.py
Last line: freshness_s=<mean seconds from the first trace of an iteration to an adapter
trained on it serving traffic>. Target: each iteration under 300 s on 2 cores.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.config import TracerlConfig  # noqa: E402
from pipelines.loop.demo import run_loop  # noqa: E402
from pipelines.loop.run import STAGES, LoopConfig  # noqa: E402
from pipelines.models.smollm2 import ensure_smollm2  # noqa: E402


def main() -> None:
    cache = Path(".tracerl").resolve()
    ensure_smollm2(cache)
    home = Path(tempfile.mkdtemp(prefix="tracerl-loop-"))
    (home / "models").symlink_to(cache / "models")
    cfg = TracerlConfig(home=home)
    cfg.kafka.embedded_port = 19392
    cfg.gateway.port = None
    try:
        out = run_loop(cfg, LoopConfig(iterations=3), fresh=False, stop_after=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    reports = out["reports"]
    print(f"\nsetup (services + first champion): {out['setup_s']:.0f}s")
    print("iteration  " + "  ".join(f"{s:>8}" for s in STAGES) + "     total  live_reward  outcome")
    for r in reports:
        print(f"{r.iteration:>9}  " + "  ".join(f"{r.stage_s.get(s, 0):>8.1f}" for s in STAGES)
              + f"  {sum(r.stage_s.values()):>8.1f}  {r.live_reward:>11.3f}  {r.outcome}")
    print(f"after the loop: live reward {out['final_reward']:.3f}")
    per_iter = [sum(r.stage_s.values()) for r in reports]
    print(f"seconds per iteration: max {max(per_iter):.0f} (target < 300)")
    fresh = [r.freshness_s for r in reports if r.freshness_s is not None]
    print(f"freshness_s={statistics.mean(fresh):.1f}" if fresh else "freshness_s=nan (no candidate was promoted)")


if __name__ == "__main__":
    main()
