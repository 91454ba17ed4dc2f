"""The canary's always-valid test on simulated canaries, checked after every batch (peeking)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.canary.decide import CONTINUE, EXPIRE, PROMOTE, ROLLBACK, Session, decide
from pipelines.canary.sequential import aipw_terms, confidence_sequence
from pipelines.config.canary import CanaryConfig, Guardrail

BATCH = 100


def stream(rng, n: int, share: float, p_champion: float, p_challenger: float, tool_errors=(0.1, 0.1)):
    """n sessions in arrival order: a sticky arm each, a 0/1 liked reward, a tool-error rate."""
    arm = (rng.random(n) < share).astype(int)
    reward = (rng.random(n) < np.where(arm == 1, p_challenger, p_champion)).astype(float)
    errors = (rng.random(n) < np.where(arm == 1, tool_errors[1], tool_errors[0])).astype(float)
    return [Session(int(a), float(r), {"tool_error_rate": float(e)}) for a, r, e in zip(arm, reward, errors)]


def run_canary(sessions, cfg):
    """Check after every batch; the first decision stands (what the sensor does)."""
    for t in range(BATCH, len(sessions) + 1, BATCH):
        d = decide(sessions[:t], cfg, hours=0.0)
        if d.outcome != CONTINUE:
            return d.outcome, t
    return CONTINUE, len(sessions)


CFG = CanaryConfig(share=0.2, alpha=0.05, t_opt=1000, max_sessions=100_000,
                   guardrails={"tool_error_rate": Guardrail("higher")})


@pytest.mark.parametrize("share", [0.1, 0.5])
def test_aa_canaries_are_rarely_decided_even_when_checked_after_every_batch(share):
    cfg = dataclasses.replace(CFG, share=share)
    rng = np.random.default_rng(0)
    runs = 300
    outcomes = [run_canary(stream(rng, 3000, share, 0.3, 0.3), cfg)[0] for _ in range(runs)]
    false_promote = outcomes.count(PROMOTE) / runs
    false_rollback = outcomes.count(ROLLBACK) / runs
    # 30 looks each: a fixed-horizon test peeked at this often would be fooled far more than alpha
    assert false_promote <= cfg.alpha and false_rollback <= cfg.alpha, (false_promote, false_rollback)


def test_peeking_a_fixed_horizon_test_would_have_been_fooled():
    """The A/A test above can fail: a plain z-test at the same alpha, looked at after every batch,
    declares a winner far more often (the reason the canary uses a confidence sequence)."""
    rng = np.random.default_rng(0)
    fooled = 0
    for _ in range(300):
        s = stream(rng, 3000, 0.2, 0.3, 0.3)
        phi = aipw_terms([x.reward for x in s], [x.arm for x in s], 0.2)
        for t in range(BATCH, 3001, BATCH):
            m, se = phi[:t].mean(), phi[:t].std(ddof=1) / np.sqrt(t)
            if abs(m) > 1.96 * se:
                fooled += 1
                break
    assert fooled / 300 > 2 * CFG.alpha


def test_a_better_challenger_is_promoted_and_a_worse_one_rolled_back():
    rng = np.random.default_rng(1)
    better = [run_canary(stream(rng, 6000, 0.5, 0.3, 0.4), dataclasses.replace(CFG, share=0.5)) for _ in range(100)]
    assert sum(o == PROMOTE for o, _ in better) >= 90, better
    # the fixed-horizon size for +0.1 at alpha 0.05 one-sided and 80% power is ~580 sessions:
    # the sequential test pays for peeking with more sessions, but not unboundedly many
    assert np.median([t for o, t in better if o == PROMOTE]) <= 3 * 580
    worse = [run_canary(stream(rng, 6000, 0.5, 0.4, 0.3), dataclasses.replace(CFG, share=0.5))[0] for _ in range(100)]
    assert worse.count(ROLLBACK) >= 90 and worse.count(PROMOTE) == 0


def test_a_guardrail_rolls_back_a_challenger_whose_reward_looks_fine():
    rng = np.random.default_rng(2)
    outcomes = [run_canary(stream(rng, 6000, 0.5, 0.3, 0.3, tool_errors=(0.05, 0.2)),
                           dataclasses.replace(CFG, share=0.5)) for _ in range(50)]
    assert sum(o == ROLLBACK for o, _ in outcomes) >= 45
    d = decide(stream(np.random.default_rng(3), 4000, 0.5, 0.3, 0.3, tool_errors=(0.05, 0.2)),
               dataclasses.replace(CFG, share=0.5), hours=0.0)
    assert d.outcome == ROLLBACK and any("guardrail tool_error_rate" in r for r in d.reasons)


def test_no_decision_before_min_sessions_and_expiry_keeps_the_champion():
    s = stream(np.random.default_rng(4), 100, 0.2, 0.0, 1.0)  # a huge gain, but too few sessions
    d = decide(s, dataclasses.replace(CFG, min_sessions=30), hours=0.0)
    assert d.outcome == CONTINUE and "min_sessions" in d.reasons[0]
    same = stream(np.random.default_rng(5), 400, 0.5, 0.3, 0.3)
    assert decide(same, dataclasses.replace(CFG, share=0.5, max_sessions=400), hours=0.0).outcome == EXPIRE
    assert decide(same, dataclasses.replace(CFG, share=0.5, max_hours=1.0), hours=2.0).outcome == EXPIRE


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.floats(-1, 1)), min_size=2, max_size=200),
       st.floats(0.05, 0.95), st.floats(0.001, 0.3))
def test_the_sequence_brackets_its_estimate(rows, share, alpha):
    arm, y = zip(*rows)
    phi = aipw_terms(y, arm, share)
    iv = confidence_sequence(phi, alpha, t_opt=100)
    assert np.isfinite(phi).all()
    assert iv.low <= iv.estimate <= iv.high and iv.n == len(rows)
    assert confidence_sequence(phi, alpha / 2, t_opt=100).high >= iv.high - 1e-12  # lower alpha, wider


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="canary.share"):
        CanaryConfig(share=1.0)
    with pytest.raises(ValueError, match="tolerance"):
        Guardrail("higher", -1.0)
    with pytest.raises(ValueError, match="one finite metric"):
        aipw_terms([0.5], [2], 0.5)
