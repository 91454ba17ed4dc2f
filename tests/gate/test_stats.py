"""Paired statistics: seeded, exact where they can be, and right on clear cases."""

import math

import numpy as np
import pytest

from pipelines.gate.stats import binom_tail_ge, compare, paired_bootstrap, sign_test


def test_bootstrap_is_seeded_and_detects_a_clear_gain():
    rng = np.random.default_rng(1)
    champ = rng.uniform(0, 1, 200)
    cand = np.clip(champ + 0.1 + rng.normal(0, 0.05, 200), 0, 1)
    a = paired_bootstrap(cand, champ, 0.95, 2000, seed=3)
    assert a == paired_bootstrap(cand, champ, 0.95, 2000, seed=3)
    assert a.low > 0.05 and a.p_gain < 0.001 and a.p_loss > 0.99 and a.n == 200


def test_bootstrap_finds_nothing_in_noise_and_bounds_straddle_zero():
    rng = np.random.default_rng(2)
    champ = rng.integers(0, 2, 100).astype(float)
    cand = rng.permutation(champ)  # same mean, shuffled pairs
    st = paired_bootstrap(cand, champ, 0.95, 2000, seed=0)
    assert st.delta == 0 and st.low < 0 < st.high and st.p_gain > 0.05


def test_identical_scores_give_no_gain():
    st = paired_bootstrap([1, 0, 1], [1, 0, 1])
    assert st.delta == 0 and st.low == 0 and st.p_gain == 1.0


@pytest.mark.parametrize("k,n,p", [(0, 5, 1.0), (5, 5, 1 / 32), (4, 5, 6 / 32), (3, 6, 42 / 64), (0, 0, 1.0)])
def test_binomial_tail_exact(k, n, p):
    assert math.isclose(binom_tail_ge(k, n), p)


def test_sign_test_is_mcnemar_exact_on_binary_scores():
    cand = [1] * 9 + [0] * 1 + [1] * 10   # 9 wins, 1 loss, 10 ties
    champ = [0] * 9 + [1] * 1 + [1] * 10
    st = sign_test(cand, champ)
    assert (st.wins, st.losses) == (9, 1)
    assert math.isclose(st.p_gain, 11 / 1024) and st.p_loss > 0.99


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="equal, non-empty"):
        compare([1, 0], [1], "bootstrap", 0.95)
    with pytest.raises(ValueError, match="test='t'"):
        compare([1], [1], "t", 0.95)
