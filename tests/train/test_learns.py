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

from pipelines import registry
from pipelines.ingest.producer import TraceProducer
from pipelines.ingest.run import run_ingest
from pipelines.models.registry import resolve_base_model
from pipelines.reward.engine import run_rewards
from pipelines.sim.env import HiddenPreference, episode, prompts
from pipelines.sim.policy import HFPolicy
from pipelines.train.adapters import AdapterStore
from pipelines.train.config import OptimizerSettings, TrainConfig
from pipelines.train.run import run_learner

TENANT, TASK, MAX_NEW = "acme", "concise", 24
ITERATIONS, GROUP = 4, 4
EVAL_SAMPLES = 8


def held_out_reward(policy: HFPolicy, pref: HiddenPreference, seed: int) -> float:
    groups = policy.sample(prompts("heldout"), EVAL_SAMPLES, MAX_NEW, seed=seed)
    return statistics.mean(pref.liked(s) for g in groups for s in g)


@pytest.mark.slow
def test_reward_on_held_out_prompts_rises_well_above_noise(cfg):
    cfg.train = TrainConfig(base_model="tiny", seed=0,
                            optimizer=OptimizerSettings(lr=2e-3, steps_per_iteration=4, micro_batch_size=32))
    cfg.learner.min_new_turns = 32
    cfg.learner.max_turns = 512
    pref = HiddenPreference()
    base = resolve_base_model("tiny", cfg.home)

    baseline = HFPolicy(base)
    noise = [held_out_reward(baseline, pref, seed) for seed in range(5)]
    before, sd = statistics.mean(noise), statistics.stdev(noise)
    margin = max(0.10, 4 * sd)

    store = AdapterStore(cfg.adapter_root)
    policy, version = baseline, None
    now = datetime.now(timezone.utc)
    for it in range(ITERATIONS):
        groups = policy.sample(prompts("train"), GROUP, MAX_NEW, seed=100 + it)
        with TraceProducer(cfg) as producer:
            for messages, group in zip(prompts("train"), groups):
                for s in group:
                    for e in episode(messages, s, pref.liked(s), tenant=TENANT, app="sim", task=TASK,
                                     model="tiny", adapter_version=version, max_tokens=MAX_NEW):
                        producer.send(e)
        assert run_ingest(cfg).landed == 3 * len(prompts("train")) * GROUP
        now += timedelta(hours=1)  # past the settle window and the post-session grace
        run_rewards(cfg.lake, now=now)
        r = run_learner(cfg, TENANT, TASK)
        assert r.status == "trained", r.reason
        assert r.new_turns == len(prompts("train")) * GROUP  # each turn trains exactly once
        registry.set_alias(cfg, TENANT, TASK, registry.CHAMPION, r.registry_version)  # the gate's job
        version = f"v{r.adapter_version}"
        policy = HFPolicy(base, store.get(TENANT, TASK, r.adapter_version).path)

    after = statistics.mean(held_out_reward(policy, pref, seed) for seed in range(5))
    print(f"held-out reward {before:.3f} (sd {sd:.3f} over 5 eval seeds) -> {after:.3f}; margin {margin:.3f}")
    assert after - before > margin, (before, after, sd)
    lineage = store.lineage(TENANT, TASK, ITERATIONS)
    assert [v.version for v in lineage] == list(range(ITERATIONS, 0, -1))
