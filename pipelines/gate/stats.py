"""Paired tests on per-item scores (candidate vs champion on the same items). Pure and seeded.

``d_i = candidate_i - champion_i`` for each item (scores averaged over its samples first).

- Paired bootstrap (Efron & Tibshirani 1993, ch. 16; Koehn 2004 for MT evals): resample items
  with replacement ``n_bootstrap`` times, take the mean of ``d`` each time; the one-sided
  ``confidence`` interval is ``[q_{alpha}, q_{1-alpha}]`` of those means. ``p_gain`` =
  (1 + #{means <= 0}) / (B + 1).
- Exact sign test: among untied pairs, ``k`` favour the candidate out of ``n``; under H0 k ~
  Binomial(n, 1/2). ``p_gain = P(K >= k)``, ``p_loss = P(K <= k)``. For 0/1 scores this is
  McNemar's exact test.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class Paired:
    test: str
    n: int                 # items
    candidate_mean: float
    champion_mean: float
    delta: float           # mean of d
    low: float             # one-sided lower bound of delta at `confidence`
    high: float            # one-sided upper bound
    p_gain: float          # evidence that the candidate is better (small = significant)
    p_loss: float          # evidence that the candidate is worse
    confidence: float
    wins: int = 0
    losses: int = 0
    sd: float = 0.0        # sd of d (ddof = 1; 0 for one item): the a posteriori MDE reads it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check(cand: Sequence[float], champ: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(cand, dtype=float), np.asarray(champ, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"paired scores need equal, non-empty lengths: {a.shape} vs {b.shape}")
    return a, b


def paired_bootstrap(cand: Sequence[float], champ: Sequence[float], confidence: float = 0.95,
                     n_bootstrap: int = 2000, seed: int = 0) -> Paired:
    a, b = _check(cand, champ)
    d = a - b
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(n_bootstrap, len(d)))
    means = d[idx].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    p_gain = (1 + int((means <= 0).sum())) / (n_bootstrap + 1)
    p_loss = (1 + int((means >= 0).sum())) / (n_bootstrap + 1)
    return Paired("bootstrap", len(d), float(a.mean()), float(b.mean()), float(d.mean()), float(low), float(high),
                  p_gain, p_loss, confidence, int((d > 0).sum()), int((d < 0).sum()), _sd(d))


def _sd(d: np.ndarray) -> float:
    return float(d.std(ddof=1)) if len(d) > 1 else 0.0


def binom_tail_ge(k: int, n: int) -> float:
    """P(K >= k) for K ~ Binomial(n, 1/2), exact."""
    if n == 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n


def sign_test(cand: Sequence[float], champ: Sequence[float], confidence: float = 0.95) -> Paired:
    a, b = _check(cand, champ)
    d = a - b
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    n = wins + losses
    p_gain, p_loss = binom_tail_ge(wins, n), binom_tail_ge(losses, n)
    # no interval from a sign test: report the observed delta as both bounds' centre
    return Paired("sign", len(d), float(a.mean()), float(b.mean()), float(d.mean()), float(d.mean()),
                  float(d.mean()), p_gain, p_loss, confidence, wins, losses, _sd(d))


def compare(cand: Sequence[float], champ: Sequence[float], test: str, confidence: float,
            n_bootstrap: int = 2000, seed: int = 0) -> Paired:
    if test == "bootstrap":
        return paired_bootstrap(cand, champ, confidence, n_bootstrap, seed)
    if test == "sign":
        return sign_test(cand, champ, confidence)
    raise ValueError(f"test={test!r}; use 'bootstrap' or 'sign'")
