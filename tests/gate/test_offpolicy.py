"""The off-policy estimators on synthetic logged data whose target-policy value is known exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.gate.offpolicy import (
    OK, REFUSE, WORSE, context_means, doubly_robust, effective_sample_size, importance_weights, judge, snis,
)

CONTEXTS, ACTIONS = 20, 6


def bandit(seed: int, shift: float, easy_hard: tuple[float, float] | None = None):
    """Contexts with their own reward level (so a context model has something to explain), a softmax
    behaviour policy q, a target π = q tilted by ``shift`` towards action 0, Bernoulli rewards.
    Context levels are uniform in [0.05, 0.6], or one of the two ``easy_hard`` levels."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(CONTEXTS, ACTIONS))
    q = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    tilt = logits.copy()
    tilt[:, 0] += shift
    pi = np.exp(tilt) / np.exp(tilt).sum(1, keepdims=True)
    level = rng.uniform(0.05, 0.6, size=(CONTEXTS, 1)) if easy_hard is None else rng.choice(easy_hard, size=(CONTEXTS, 1))
    p = np.clip(level + np.where(np.arange(ACTIONS) == 0, 0.3, 0.0), 0, 1)  # action 0 is liked more
    return q, pi, p, float((pi * p).sum(1).mean())


def logged(q, pi, p, n: int, rng):
    """n turns served by q: (contexts, log π of the reply, log q of the reply, rewards)."""
    x = rng.integers(CONTEXTS, size=n)
    a = np.array([rng.choice(ACTIONS, p=q[i]) for i in x])
    r = (rng.random(n) < p[x, a]).astype(float)
    return x, np.log(pi[x, a]), np.log(q[x, a]), r


@pytest.mark.parametrize("method", ["snis", "dr"])
def test_estimate_is_unbiased_within_its_stated_error(method):
    q, pi, p, truth = bandit(0, shift=1.0)
    rng = np.random.default_rng(1)
    est, covered = [], 0
    for _ in range(300):
        x, lp, lq, r = logged(q, pi, p, 400, rng)
        w = importance_weights(lp, lq, clip=1e6)  # no clip: the consistent estimator
        e = snis(r, w) if method == "snis" else doubly_robust(r, w, context_means(r, [str(i) for i in x]),
                                                              context_means(r, [str(i) for i in x]))
        est.append(e.value)
        lo, hi = e.bounds(1.96)
        covered += lo <= truth <= hi
    est = np.asarray(est)
    # the mean of 300 estimates sits on the truth (to ~4 of its standard errors), and the stated
    # 95% intervals cover it about 95% of the time
    assert abs(est.mean() - truth) < 4 * est.std() / np.sqrt(len(est)) + 0.005, (est.mean(), truth)
    assert 0.90 <= covered / 300 <= 0.99, covered


def test_a_context_model_makes_the_estimate_tighter():
    # easy and hard prompts (liked 0% or 65% of the time before the action's own +0.3): most of
    # the reward's variance is the context's, which the model explains and the weights then do not carry
    q, pi, p, _ = bandit(0, shift=2.0, easy_hard=(0.0, 0.65))
    rng = np.random.default_rng(2)
    sn, dr = [], []
    for _ in range(200):
        x, lp, lq, r = logged(q, pi, p, 400, rng)
        w = importance_weights(lp, lq, clip=1e6)
        m = context_means(r, [str(i) for i in x])
        sn.append(snis(r, w).value)
        dr.append(doubly_robust(r, w, m, m).value)
    assert np.std(dr) < np.std(sn)


def test_far_target_has_a_small_ess_and_is_refused():
    q, pi, p, _ = bandit(0, shift=8.0)  # the target plays action 0 almost always; q rarely did
    x, lp, lq, r = logged(q, pi, p, 400, np.random.default_rng(3))
    e = snis(r, importance_weights(lp, lq, clip=1e6))
    assert e.ess < 100
    v = judge(e, r, alpha=0.05, min_ess=100)
    assert v.verdict == REFUSE and "effective sample size" in v.reason


def test_a_worse_candidate_is_kept_out_and_an_equal_one_is_not():
    q, _, p, _ = bandit(0, shift=0.0)
    # a candidate that avoids the liked action 0: its value is well below the champion's (q's)
    bad = q.copy()
    bad[:, 0] = 1e-3
    bad /= bad.sum(1, keepdims=True)
    _, lp_bad, lq, r = logged(q, bad, p, 2000, np.random.default_rng(4))
    worse = judge(snis(r, importance_weights(lp_bad, lq, clip=50)), r, alpha=0.05, min_ess=50)
    assert worse.verdict == WORSE and worse.high < 0, worse.reason
    same = judge(snis(r, importance_weights(lq, lq, clip=50)), r, alpha=0.05, min_ess=50)
    assert same.verdict == OK and same.low < 0 < same.high, same.reason


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-60, 0), st.floats(-60, 0), st.floats(-1, 1)), min_size=1, max_size=50),
       st.floats(1.0, 1e4))
def test_estimates_stay_in_the_rewards_range_and_ess_in_0_n(rows, clip):
    lp, lq, r = (np.array(c) for c in zip(*rows))
    w = importance_weights(lp, lq, clip)
    assert ((w >= 0) & (w <= clip * (1 + 1e-9))).all()
    e = snis(r, w, clip)
    assert 0 <= e.ess <= len(r) + 1e-9
    if w.sum() > 0:
        assert r.min() - 1e-9 <= e.value <= r.max() + 1e-9
    assert effective_sample_size(np.ones(len(r))) == pytest.approx(len(r))


def test_bad_inputs_name_what_is_wrong():
    with pytest.raises(ValueError, match="one each per turn"):
        importance_weights([0.0], [0.0, 0.0], clip=10)
    with pytest.raises(ValueError, match="clip"):
        importance_weights([0.0], [0.0], clip=0)
    with pytest.raises(ValueError, match="finite"):
        snis([float("nan")], np.ones(1))
    with pytest.raises(ValueError, match="one weight per turn"):
        snis([], np.ones(0))
