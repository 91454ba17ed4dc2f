"""Learning that holds: a preference nobody tuned to, liked rarely, voted on rarely.

The simulated users of the `style` family like a reply that opens with a greeting: about 6%
of the tiny model's replies do. They vote thumbs on 30% of turns; on the rest they only act
(regenerate, complain, abandon, say thanks, finish the task), as production users do. The
learner runs on shipped learner defaults (branch, replay, uniform groups centred on the task
baseline, lenient staleness); the optimizer settings (lr 5e-3, 8 steps) and the per-iteration
turn cap are the tiny model's: at lr 2e-3 x 4 steps it moved 0.048 -> 0.087 in 4 iterations,
dense or sparse. Measured: 0.048 -> 0.229 (train seed 0) and -> 0.417 (seed 1) in 5 iterations.
After K iterations the liked share on held-out prompts must rise by a margin well above the
eval's own seed-to-seed noise, measured first.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta, timezone

import pytest

from pipelines.models.registry import resolve_base_model
from pipelines.sim.families import family
from pipelines.sim.loop import SimTask, held_out_reward, iterate
from pipelines.sim.policy import HFPolicy
from pipelines.sim.sessions import UserModel
from pipelines.config.train import OptimizerSettings, TrainConfig

ITERATIONS, EVAL_SEEDS = 5, 4
EXPLICIT_RATE = 0.3


@pytest.mark.slow
def test_a_rare_preference_with_sparse_votes_rises_well_above_noise(cfg):
    cfg.train = TrainConfig(base_model="tiny", seed=0,
                            optimizer=OptimizerSettings(lr=5e-3, steps_per_iteration=8, micro_batch_size=32))
    cfg.learner.max_turns = 1024  # an iteration's ~500 turns in one step, as test_learns does
    pref = family("style")
    t = SimTask.for_family(pref, users=UserModel(turns_per_session=(1, 2), explicit_rate=EXPLICIT_RATE))
    base = resolve_base_model("tiny", cfg.home)

    policy = HFPolicy(base)
    noise = [held_out_reward(policy, pref, t, seed) for seed in range(EVAL_SEEDS)]
    before, sd = statistics.mean(noise), statistics.stdev(noise)
    assert before <= 0.10, f"the family must be rare on the tiny model: base rate {before:.3f}"
    margin = max(0.10, 4 * sd)

    version, now, voted, turns, replayed = None, datetime.now(timezone.utc), 0, 0, 0
    for it in range(ITERATIONS):
        now += timedelta(hours=1)  # event-time clock: past the settle window
        r, policy, stats = iterate(cfg, base, policy, pref, t, version, seed=100 + it, now=now)
        assert stats["landed"] == stats["events"]
        assert r.status == "trained", r.reason
        voted, turns, replayed = voted + stats["voted"], turns + stats["turns"], replayed + r.replayed_turns
        version = r.adapter_version

    after = statistics.mean(held_out_reward(policy, pref, t, seed) for seed in range(EVAL_SEEDS))
    print(f"style (tiny): held-out {before:.3f} (sd {sd:.3f} over {EVAL_SEEDS} eval seeds) -> {after:.3f}; "
          f"margin {margin:.3f}; {voted}/{turns} turns voted; {replayed} replayed")
    assert voted / turns <= EXPLICIT_RATE + 0.05  # the feedback really was sparse
    assert replayed > 0  # earlier windows kept teaching
    assert after - before > margin, (before, after, sd)
