"""Minimum detectable effect: the formula, the a priori bound, and the too-small-suite warning."""

import numpy as np
import pytest

from pipelines.gate import power
from pipelines.config.gate import GateConfig
from pipelines.gate.decide import decide, judge_suite
from pipelines.gate.stats import paired_bootstrap


def test_mde_formula_and_prior():
    # (1.645 + 0.842) * 0.5 / sqrt(100)
    assert power.mde(0.5, 100, 0.05, 0.8) == pytest.approx(0.1243, abs=1e-4)
    # worst case, 32 items, 1 sample: sd(d) = sqrt(0.5)
    assert power.mde_prior(32, 1, 0.05, 0.8) == pytest.approx(2.4865 * 0.70711 / 32 ** 0.5, abs=1e-3)
    # 4x the samples halves it; a champion near 0 or 1 has less variance (Laplace-shrunk, never 0)
    assert power.mde_prior(32, 4, 0.05, 0.8) == pytest.approx(power.mde_prior(32, 1, 0.05, 0.8) / 2)
    assert 0 < power.mde_prior(32, 1, 0.05, 0.8, champion_mean=1.0) < power.mde_prior(32, 1, 0.05, 0.8, 0.5)
    n = power.items_for(0.15, 1, 0.05, 0.8)
    assert power.mde_prior(n, 1, 0.05, 0.8) <= 0.15 < power.mde_prior(n - 1, 1, 0.05, 0.8)
    assert power.mde_observed([0.1, 0.1, 0.1], 0.05, 0.8) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="n=0"):
        power.mde(1.0, 0, 0.05, 0.8)


def test_mde_is_the_gain_the_test_finds_with_that_power():
    """Simulated: a true gain equal to the observed-sd MDE is found ~80% of the time."""
    rng = np.random.default_rng(0)
    n, sd, found = 100, 0.4, 0
    effect = power.mde(sd, n, 0.05, 0.8)
    for i in range(400):
        d = rng.normal(effect, sd, n)
        found += paired_bootstrap(d, np.zeros(n), 0.95, 500, i).p_gain < 0.05
    assert 0.72 <= found / 400 <= 0.88


def test_a_small_suite_warns_with_numbers_and_does_not_block():
    gate = GateConfig(temperature=0.0, samples_per_item=1)  # one greedy sample per item, one look
    cand, champ = [1.0] * 32, [0.0] * 12 + [1.0] * 20
    v = judge_suite("answers", "primary", 0.0, paired_bootstrap(cand, champ), gate)
    assert v.passed and v.mde > gate.max_mde
    assert "suite answers (n=32, 1 sample/item) can only detect gains >= " in v.warning
    assert "add items" in v.warning and "MDE at power 0.80" in v.reason
    d = decide([v], gate)
    assert d.outcome == "promote" and d.warnings == [v.warning] and d.reasons[-1] == "warning: " + v.warning
    big = judge_suite("answers", "primary", 0.0, paired_bootstrap([1.0] * 400, [0.0] * 100 + [1.0] * 300), gate)
    assert big.warning is None and big.mde <= gate.max_mde
