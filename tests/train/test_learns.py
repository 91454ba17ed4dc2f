"""The proof that tracerl learns: the whole data path, a hidden preference, the tiny model.

The policy (the current champion) samples replies to training prompts; simulated
users thumb them up or down by a preference the learner never sees; the events go
through the real broker, the exactly-once ingest, the reward engine, and the
learner, which trains the next adapter from the champion. After K iterations the
mean reward on *held-out* prompts must rise by a margin well above the eval's own
seed-to-seed noise, which the test measures first.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta, timezone

import pytest

from pipelines.models.registry import resolve_base_model
from pipelines.sim.env import HiddenPreference
from pipelines.sim.loop import SimTask, held_out_reward, iterate
from pipelines.sim.policy import HFPolicy
from pipelines.adapters.store import AdapterStore
from pipelines.config.train import OptimizerSettings, TrainConfig

ITERATIONS, EVAL_SEEDS = 4, 5


@pytest.mark.slow
def test_reward_on_held_out_prompts_rises_well_above_noise(cfg):
    cfg.train = TrainConfig(base_model="tiny", seed=0,
                            optimizer=OptimizerSettings(lr=2e-3, steps_per_iteration=4, micro_batch_size=32))
    cfg.learner.min_new_turns, cfg.learner.max_turns = 32, 512
    t, pref = SimTask(), HiddenPreference()
    base = resolve_base_model("tiny", cfg.home)

    policy = HFPolicy(base)
    noise = [held_out_reward(policy, pref, t, seed) for seed in range(EVAL_SEEDS)]
    before, sd = statistics.mean(noise), statistics.stdev(noise)
    margin = max(0.10, 4 * sd)

    version, now = None, datetime.now(timezone.utc)
    for it in range(ITERATIONS):
        now += timedelta(hours=1)  # event-time clock: past the settle window and session grace
        r, policy, stats = iterate(cfg, base, policy, pref, t, version, seed=100 + it, now=now)
        assert stats["landed"] == stats["events"]
        assert r.status == "trained", r.reason
        assert r.new_turns == len(t.prompts("train")) * t.group  # each turn trains exactly once
        version = r.adapter_version

    after = statistics.mean(held_out_reward(policy, pref, t, seed) for seed in range(EVAL_SEEDS))
    print(f"held-out reward {before:.3f} (sd {sd:.3f} over {EVAL_SEEDS} eval seeds) -> {after:.3f}; "
          f"margin {margin:.3f}")
    assert after - before > margin, (before, after, sd)
    lineage = AdapterStore(cfg.adapter_root).lineage(t.tenant, t.task, ITERATIONS)
    assert [v.version for v in lineage] == list(range(ITERATIONS, 0, -1))
