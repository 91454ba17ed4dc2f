"""The proof that tracerl learns: the product's loop, a hidden preference, the tiny model.

Simulated users of the `concise` family (they like a reply that stops by itself within 10 tokens
and ends with '.') talk to the gateway, which serves the champion from vLLM; every turn is voted
(dense feedback). Each iteration is one in-process run of `closed_loop_job`: Kafka -> lake ->
rewards -> learner -> gate (private evals in vLLM) -> deployment. The target's optimizer settings
are the tiny model's, in tracerl.toml. After K iterations the liked share on *held-out* prompts
(served by vLLM) must rise by a margin well above the eval's own seed-to-seed noise, measured first,
for the champion the gate let through.

Measured (train seed 1, 2 cores shared with four other test runs, 3834 s wall of which 2030 s
setup): base v1 0.341 (sd 0.024 over 5 eval seeds, margin 0.10) -> champion v3 0.785; the
branch head v5 0.898. Gate: iteration 1 reject by the length signature (mean reply 36.6 -> 13.4
chars, ratio 0.38 < 0.5: short is this family's preference; KL 0.43 > branch_max_kl resets the
branch), 2 promote (private eval 0.56 -> 0.83, +0.27 at the first look; live reward of the next
traffic 0.333 -> 0.766), 3 interrupted (the measuring harness's own timeout), 4 reject (KL 2.28 >
gate.max_kl 0.5). No second seed has run yet.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.train.served_loop import served_loop

# Not in `make test` yet: it has not passed a clean run (see the docstring), and on 2 shared cores it
# takes ~1 h. It is the replacement for the in-process proof (pipelines/sim/loop.py) once it does.
pytestmark = pytest.mark.skipif(os.environ.get("TRACERL_SERVED_PROOFS") != "1",
                                reason="opt-in: TRACERL_SERVED_PROOFS=1 (the proof through the Dagster job, ~1 h)")

ITERATIONS, EVAL_SEEDS, SAMPLES = 4, 5, 8
SEED = int(os.environ.get("TRACERL_PROOF_SEED", "0"))
TARGET = f"""
[targets."acme/concise".learner]
min_new_turns = 32
max_turns = 512
[targets."acme/concise".train]
seed = {SEED}
[targets."acme/concise".train.optimizer]
lr = 2e-3
steps_per_iteration = 4
micro_batch_size = 32
"""


@pytest.mark.slow
def test_reward_on_held_out_prompts_rises_well_above_noise(tmp_path, broker, shared_models):
    from pipelines.adapters import registry
    from pipelines.loop.bootstrap import ensure_serving
    from pipelines.loop.demo import LoopConfig
    from pipelines.sim.traffic import TrafficConfig

    t0 = time.monotonic()
    traffic = TrafficConfig(requests=384, users=16, max_tokens=24, turns_per_session=(1, 1), explicit_rate=1.0,
                            seed=100 * SEED)
    lc = LoopConfig(task="concise", iterations=ITERATIONS, traffic=traffic, preference_max_tokens=10)
    fam = lc.preference()
    with served_loop(tmp_path, broker.bootstrap, TARGET, shared_models) as loop:
        v1 = ensure_serving(loop.cfg, "acme", "concise")

        def rate(v):
            return loop.rate("acme", "concise", v, fam, seeds=EVAL_SEEDS, samples=SAMPLES, max_tokens=24)

        before = rate(v1)
        margin = max(0.10, 4 * before.sd)
        loop.say(f"[concise] before: v{v1} {before}; margin {margin:.3f} ({time.monotonic() - t0:.0f}s)")
        reports = [loop.iterate(lc, i) for i in range(1, ITERATIONS + 1)]
        champion = registry.adapter_for_alias(loop.cfg, "acme", "concise", registry.CHAMPION)
        after = rate(champion) if champion != v1 else before
        runs = {r.run_id: loop.instance.get_run_by_id(r.run_id) for r in reports}
    loop.say(f"[concise] seed {SEED}: held-out {before} -> champion v{champion} {after}; margin {margin:.3f}; "
             f"gate {[r.outcome for r in reports]}; {time.monotonic() - t0:.0f}s")

    for r in reports:
        assert r.requests == traffic.requests and r.failed_requests == 0
        assert r.candidate is not None, r.reasons  # every iteration trained a candidate
        assert r.outcome in ("promote", "reject") and r.reasons  # and the gate decided it, saying why
        assert runs[r.run_id].tags["tracerl/outcome"] == r.outcome  # on the Dagster run
    assert "promote" in [r.outcome for r in reports]
    assert champion == max(r.candidate for r in reports if r.outcome == "promote")  # what the gate let through
    assert after.mean - before.mean > margin, (before, after)  # serves, and is better on unseen prompts
