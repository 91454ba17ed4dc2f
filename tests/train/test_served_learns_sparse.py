"""Learning that holds: a preference nobody tuned to, liked rarely, voted on rarely; the product's loop.

The simulated users of the `style` family like a reply that opens with a greeting: about 6% of
the tiny model's replies do. They talk to the gateway in sessions of 1-2 turns and vote thumbs on
30% of turns; on the rest they only act (regenerate, complain, abandon, say thanks, finish the
task), as production users do. Each iteration is one in-process run of `closed_loop_job`
(Kafka -> lake -> rewards -> learner -> gate -> deployment) on shipped learner defaults (branch,
replay, uniform groups centred on the task baseline, lenient staleness); the target's optimizer
settings (lr 5e-3, 8 steps), turn cap and branch KL budget are the tiny model's, in tracerl.toml.
After K iterations the liked share on held-out prompts (served by vLLM) must rise by a margin well
above the eval's own seed-to-seed noise, measured first. It asserts on the branch head (the
learner's newest candidate) and on every gate decision being recorded.

Measured on an idle 2-core machine, train seed 0: base v1 0.042 (sd 0.019 over 4 eval seeds,
margin 0.10) -> head v6 0.247 in 495 s (iterations 47-64 s) after five iterations; 819/2701 turns voted, 1024 replayed.
The gate promoted v2 (+0.021 at look 2, p 0.013) and rejected the rest: 0 gain at look 1, then
KL to base 0.61 and 0.65 > gate.max_kl 0.5, so the champion stayed at 0.049. At this lr
one iteration moves KL 0.45-0.65; with the default `branch_max_kl` 0.3 the branch reset every
other iteration and the head only reached 0.077 (same seed), so the target raises it to 3.0.
Seed 1: 0.042 -> head v6 0.194 in 436 s; the gate rejected all five (v1 stayed champion).
Five iterations were too few to hold: a CI run (2026-12-04, seed 0, vLLM's batching makes each
run a fresh sample) reached only 0.111 (+0.069 < margin) where that day's local run reached 0.189.
Seven: 0.042 -> head v8 0.276 in 276 s (iterations 21-31 s), 1170/3851 turns voted.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.train.served_loop import served_loop

ITERATIONS, EVAL_SEEDS, SAMPLES = 7, 4, 8
EXPLICIT_RATE = 0.3
SEED = int(os.environ.get("TRACERL_PROOF_SEED", "0"))
TARGET = f"""
[targets."acme/style".learner]
max_turns = 1024  # an iteration's ~550 turns in one step
branch_max_kl = 3.0  # at lr 5e-3 one iteration moves KL 0.45-0.65: the default 0.3 reset the branch every other one
[targets."acme/style".train]
seed = {SEED}
[targets."acme/style".train.optimizer]
lr = 5e-3
steps_per_iteration = 8
micro_batch_size = 32
"""


@pytest.mark.slow
def test_a_rare_preference_with_sparse_votes_rises_well_above_noise(tmp_path, broker, shared_models):
    from pipelines.adapters import registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.lake.query import connect
    from pipelines.loop.bootstrap import ensure_serving
    from pipelines.loop.demo import LoopConfig
    from pipelines.sim.traffic import TrafficConfig

    t0 = time.monotonic()
    traffic = TrafficConfig(requests=384, users=16, max_tokens=24, turns_per_session=(1, 2),
                            explicit_rate=EXPLICIT_RATE, seed=100 * SEED)
    lc = LoopConfig(task="style", iterations=ITERATIONS, traffic=traffic)
    fam = lc.preference()
    with served_loop(tmp_path, broker.bootstrap, TARGET, shared_models) as loop:
        v1 = ensure_serving(loop.cfg, "acme", "style")

        def rate(v):
            return loop.rate("acme", "style", v, fam, seeds=EVAL_SEEDS, samples=SAMPLES, max_tokens=24)

        before = rate(v1)
        assert before.mean <= 0.10, f"the family must be rare on the tiny model: base rate {before}"
        margin = max(0.10, 4 * before.sd)
        loop.say(f"[style] before: v{v1} {before}; margin {margin:.3f} ({time.monotonic() - t0:.0f}s)")
        reports = loop.iterations(lc)
        champion = registry.adapter_for_alias(loop.cfg, "acme", "style", registry.CHAMPION)
        store = AdapterStore(loop.cfg.adapter_root)
        head = store.list("acme", "style")[-1]
        after_champion = rate(champion) if champion != v1 else before
        after_head = rate(head.version)
        turns, voted = connect(loop.cfg.lake).execute(
            "SELECT count(*), count(thumbs) FROM rewards WHERE tenant = 'acme' AND task = 'style' AND settled").fetchone()
        replayed = sum(len((store.get("acme", "style", r.candidate).meta.get("data_window") or {})
                           .get("replayed_turn_ids") or []) for r in reports)
    loop.say(f"[style] seed {SEED}: held-out {before} -> champion v{champion} {after_champion.mean:.3f}, "
             f"head v{head.version} {after_head.mean:.3f}; margin {margin:.3f}; gate "
             f"{[r.outcome for r in reports]}; {voted}/{turns} turns voted; {replayed} replayed; "
             f"{time.monotonic() - t0:.0f}s")

    assert voted / turns <= EXPLICIT_RATE + 0.05  # the feedback really was sparse
    assert replayed > 0  # earlier windows kept teaching
    assert head.version == reports[-1].candidate
    assert after_head.mean - before.mean > margin, (before, after_head)
