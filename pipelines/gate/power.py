"""Power of the paired test: the smallest true gain a suite can detect (MDE). Pure.

For a one-sided test at level alpha with power 1 - beta on n paired items, the normal
approximation gives  MDE = (z_{1-alpha} + z_{1-beta}) * sd(d) / sqrt(n),  d = candidate - champion
per item (scores averaged over the item's samples first).

- A priori (``mde_prior``), from the suite size and sampling alone: scores are in [0, 1], so one
  sample's variance is at most p(1-p) for a model whose mean is p (the largest variance a [0, 1]
  variable with that mean can have; 0.25 at p = 0.5, the worst case before anything ran). With
  candidate and champion sampled independently and k samples per item,
  sd(d) <= sqrt(2 p(1-p) / k). ``p`` is the champion's observed mean, shrunk by Laplace
  ((n p + 1) / (n + 2)) so an all-0 or all-1 champion does not claim a variance of 0; None = 0.5.
  It ignores the pairing's gain (correlated scores make sd(d) smaller) and the spread of true
  per-item effects (which more samples do not remove), so it is a planning number, not a bound.
- A posteriori (``mde_observed``): the same formula with the observed sd(d) (ddof = 1).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Sequence

import numpy as np


def z(p: float) -> float:
    """The standard normal quantile."""
    return NormalDist().inv_cdf(p)


def mde(sd: float, n: int, alpha: float, power: float) -> float:
    """(z_{1-alpha} + z_{power}) * sd / sqrt(n)."""
    if n < 1 or not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"mde needs n >= 1, alpha and power in (0, 1): n={n}, alpha={alpha}, power={power}")
    return (z(1.0 - alpha) + z(power)) * sd / math.sqrt(n)


def prior_sd(n: int, samples_per_item: int, champion_mean: float | None = None) -> float:
    """sd(d) of independent [0, 1] scores with the champion's (shrunk) mean; worst case p = 0.5."""
    p = 0.5 if champion_mean is None else (n * min(max(champion_mean, 0.0), 1.0) + 1.0) / (n + 2.0)
    return math.sqrt(2.0 * p * (1.0 - p) / samples_per_item)


def mde_prior(n: int, samples_per_item: int, alpha: float, power: float,
              champion_mean: float | None = None) -> float:
    return mde(prior_sd(n, samples_per_item, champion_mean), n, alpha, power)


def mde_observed(d: Sequence[float], alpha: float, power: float) -> float:
    """From the observed per-item differences; 0 when every d is equal (nothing varied)."""
    arr = np.asarray(d, dtype=float)
    sd = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    return mde(sd, len(arr), alpha, power)


def items_for(target_mde: float, samples_per_item: int, alpha: float, power: float,
              champion_mean: float | None = None) -> int:
    """Items a suite needs for ``mde_prior <= target_mde`` (the warning's advice)."""
    sd = prior_sd(10 ** 6, samples_per_item, champion_mean)
    return math.ceil(((z(1.0 - alpha) + z(power)) * sd / target_mde) ** 2)
