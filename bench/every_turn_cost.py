"""What learning from every turn costs: an iteration's wall time, every turn against labelled-only, same traffic.

One lake of realistic traffic (the tiny Llama serving the `style` family, SESSIONS sessions of
`UserModel.realistic(0.05)` users through the offline driver, as bench/every_turn.py's first
iteration). Each repetition copies it twice and runs, for each condition of bench/every_turn.py, the
reward stage and one learner iteration in a fresh process, as a Dagster run does (imports, model
loads and the reward model's feature pass included, the feature cache cold: every turn is new):

- labelled-only: hindsight off in the reward spec, `learner.reward_model` off;
- every turn: hindsight on, `learner.reward_model` on.

Printed per repetition: the process's wall time, the reward stage's and the learner's own stage
split (`seconds.*`). Conditions alternate, REPEATS times; medians are reported.

    .venv/bin/python bench/every_turn_cost.py
    TRACERL_COST_SESSIONS=500 TRACERL_COST_REPEATS=2 .venv/bin/python bench/every_turn_cost.py

Last line: every_turn_cost_ratio=<median wall time of an iteration (rewards + learner, fresh
process), every turn / labelled-only>; the line before it gives the learner's own ratio.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SESSIONS = int(os.environ.get("TRACERL_COST_SESSIONS", "1000"))
REPEATS = int(os.environ.get("TRACERL_COST_REPEATS", "3"))
START = datetime(2026, 11, 1, tzinfo=timezone.utc)
CONDITIONS = ("labelled-only", "every turn")  # bench/every_turn.py learner_config's two


def child(condition: str, home: Path, base: Path) -> None:
    """One iteration in this process: the reward stage, then the learner; prints its timings."""
    t0 = time.perf_counter()
    from bench.every_turn import learner_config
    from pipelines.reward.engine import run_rewards
    from pipelines.train.run import run_learner

    cfg, book = learner_config(condition, 0, base, home)
    t1 = time.perf_counter()
    run_rewards(cfg.lake, book=book, now=START + timedelta(days=2))
    t2 = time.perf_counter()
    r = run_learner(cfg, "acme", "style")
    t3 = time.perf_counter()
    print("RESULT " + json.dumps({"imports": t1 - t0, "rewards": t2 - t1, "learner": t3 - t2, "status": r.status,
                                  "stages": {k[8:]: v for k, v in r.metrics.items() if k.startswith("seconds.")},
                                  "turns": {k[6:]: v for k, v in r.metrics.items() if k.startswith("turns.")}}),
          flush=True)


def main() -> None:
    from pipelines.ingest.direct import land
    from pipelines.models.registry import resolve_base_model
    from pipelines.sim.families import family
    from pipelines.sim.offline import OfflineTraffic, play_sessions
    from pipelines.sim.policy import HFPolicy
    from pipelines.sim.sessions import UserModel

    with tempfile.TemporaryDirectory(prefix="every-turn-cost-") as tmp:
        root = Path(tmp)
        base = resolve_base_model("tiny", root / "models")
        snap = root / "snapshot"
        events, liked = play_sessions(HFPolicy(base, None), family("style"), UserModel.realistic(0.05),
                                      OfflineTraffic(sessions=SESSIONS, seed=0), START)
        land(snap / "lake", events)
        print(f"traffic: {len(liked)} turns, liked {sum(liked) / len(liked):.3f}", flush=True)
        walls: dict[str, list[float]] = {c: [] for c in CONDITIONS}
        learner: dict[str, list[float]] = {c: [] for c in CONDITIONS}
        for rep in range(REPEATS):
            for c in CONDITIONS:
                home = root / f"run-{rep}-{c.replace(' ', '-')}"
                shutil.copytree(snap, home)
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, __file__], capture_output=True, text=True, check=True,
                                     env={**os.environ, "TRACERL_COST_CHILD": json.dumps([c, str(home), str(base)])})
                wall = time.perf_counter() - t0
                res = json.loads(next(ln[7:] for ln in out.stdout.splitlines() if ln.startswith("RESULT ")))
                walls[c].append(wall)
                learner[c].append(res["learner"])
                stages = ", ".join(f"{k} {v:.1f}" for k, v in res["stages"].items())
                print(f"[{c}] repeat {rep + 1}: {res['status']}, process {wall:.1f} s (imports {res['imports']:.1f}, "
                      f"rewards {res['rewards']:.1f}, learner {res['learner']:.1f}: {stages}); turns {res['turns']}",
                      flush=True)
                shutil.rmtree(home)
    lab, every = CONDITIONS
    for c in CONDITIONS:
        print(f"{c}: median process {statistics.median(walls[c]):.1f} s, learner {statistics.median(learner[c]):.1f} s")
    print(f"learner_cost_ratio={statistics.median(learner[every]) / statistics.median(learner[lab]):.3f}")
    print(f"every_turn_cost_ratio={statistics.median(walls[every]) / statistics.median(walls[lab]):.3f}")


if __name__ == "__main__":
    if os.environ.get("TRACERL_COST_CHILD"):
        condition, home, base = json.loads(os.environ["TRACERL_COST_CHILD"])
        child(condition, Path(home), Path(base))
    else:
        main()
