"""Does the learner move SmolLM2-135M-Instruct? Reward before and after each iteration.

The same loop as the proof-of-learning test (tests/train/test_learns.py) on the real
model: the champion serves training prompts, simulated users react by a hidden
preference (a complete reply, ending with '.', within 40 tokens), events flow through
the embedded Kafka, ingest, rewards and the learner; the new adapter becomes champion.
Held-out reward is measured before and after every iteration.

    .venv/bin/python bench/learn.py
Last line: held_out_reward_gain=<after - before>
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.config import TracerlConfig  # noqa: E402
from pipelines.models.smollm2 import ensure_smollm2  # noqa: E402
from pipelines.services.kafka import start_broker, stop_broker  # noqa: E402
from pipelines.sim.env import HiddenPreference  # noqa: E402
from pipelines.sim.loop import SimTask, held_out_reward, iterate  # noqa: E402
from pipelines.sim.policy import HFPolicy  # noqa: E402
from pipelines.train.config import OptimizerSettings, TrainConfig  # noqa: E402

ITERATIONS = 3


def main() -> None:
    base = ensure_smollm2(Path(".tracerl"))
    home = Path(tempfile.mkdtemp(prefix="tracerl-learn-"))
    cfg = TracerlConfig(home=home)
    cfg.kafka.embedded_port = 19292
    cfg.ingest.idle_seconds = 1.0
    cfg.train = TrainConfig(base_model=str(base), seed=0, optimizer=OptimizerSettings(
        lr=1e-4, steps_per_iteration=4, micro_batch_size=8))
    cfg.learner.min_new_turns, cfg.learner.max_turns = 32, 512
    t = SimTask(group=4, max_new_tokens=64, eval_samples=4, train_prompts=32, heldout_prompts=16)
    pref = HiddenPreference(max_tokens=40)
    start_broker(cfg)
    try:
        policy = HFPolicy(base)
        before = held_out_reward(policy, pref, t, seed=0)
        print(f"iteration 0: held-out reward {before:.3f} ({t.heldout_prompts} prompts x {t.eval_samples})")
        version, now, first = None, datetime.now(timezone.utc), before
        for it in range(1, ITERATIONS + 1):
            t0 = time.monotonic()
            now += timedelta(hours=1)
            r, policy, stats = iterate(cfg, base, policy, pref, t, version, seed=100 + it, now=now)
            version = f"v{r.adapter_version}"
            after = held_out_reward(policy, pref, t, seed=0)
            print(f"iteration {it}: live reward {stats['live_reward']:.3f} -> held-out {before:.3f} -> {after:.3f} "
                  f"(adapter {version}, {r.new_turns} turns, kl {r.metrics.get('kl', float('nan')):.4f}, "
                  f"{time.monotonic() - t0:.0f}s)")
            before = after
        print(f"held_out_reward_gain={after - first:.3f}")
    finally:
        stop_broker(cfg)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
