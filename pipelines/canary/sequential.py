"""Always-valid comparison of two arms from live traffic: a confidence sequence for the difference
of their means, safe to check after every batch. Pure (numpy).

Unit: one session (conversation). The gateway assigns whole sessions to an arm (sticky hash), so
turns of one session are not independent draws; a session's metric (its mean turn reward, its
tool-error rate, ...) is one observation.

Estimator (Waudby-Smith et al. 2023, "Time-uniform central limit theory and asymptotic confidence
sequences", §A/B tests): with challenger share s and arm A_i ∈ {0, 1}, the AIPW pseudo-outcome

    φ_i = m1_{i-1} − m0_{i-1} + A_i (y_i − m1_{i-1}) / s − (1 − A_i)(y_i − m0_{i-1}) / (1 − s)

has mean Δ = E[y | challenger] − E[y | champion] whatever the plug-in means m (running means of
each arm over sessions before i: predictable), and near-minimal variance when they are good.

Boundary (their Theorem 2.2, Robbins' normal mixture): with σ̂_t the sample sd of φ_1..φ_t,

    Δ̂_t ± σ̂_t · sqrt( 2(tρ² + 1) / (t²ρ²) · log( sqrt(tρ² + 1) / α ) )

covers Δ at every t at once with probability ≥ 1 − α (asymptotically: it needs enough sessions
for the CLT, hence ``min_sessions``). ρ sets where the sequence is tightest:
ρ² = (−2 log α + log(−2 log α + 1)) / t_opt (Howard et al. 2021, eq. 3.19). Checking it after
every batch and stopping at the first crossing does not inflate the error, unlike a t-test.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np


def aipw_terms(y: Sequence[float], arm: Sequence[int], share: float, prior: float = 0.0) -> np.ndarray:
    """φ_1..φ_n in arrival order (see above). ``prior``: an arm's plug-in mean before its first
    session (any fixed number keeps φ unbiased; a good guess only lowers the early variance)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"share={share!r} must be in (0, 1): the challenger's share of sessions")
    y, a = np.asarray(y, dtype=float), np.asarray(arm, dtype=int)
    if y.shape != a.shape or not np.isin(a, (0, 1)).all() or not np.isfinite(y).all():
        raise ValueError("one finite metric and one arm (0 champion, 1 challenger) per session")
    m = []
    for k in (0, 1):  # each arm's mean over the sessions before i (predictable), `start` before its first
        hit = (a == k).astype(float)
        count = np.concatenate(([0.0], np.cumsum(hit)[:-1]))
        total = np.concatenate(([0.0], np.cumsum(hit * y)[:-1]))
        m.append(np.where(count > 0, total / np.maximum(count, 1.0), float(prior)))
    return m[1] - m[0] + a * (y - m[1]) / share - (1 - a) * (y - m[0]) / (1 - share)


def mixture_rho(alpha: float, t_opt: int) -> float:
    """ρ that makes the boundary tightest near ``t_opt`` observations."""
    la = -2.0 * math.log(alpha)
    return math.sqrt((la + math.log(la + 1.0)) / t_opt)


@dataclass(frozen=True)
class Interval:
    """The confidence sequence at time ``n``: Δ̂ and bounds valid at every n at once (level alpha)."""

    n: int
    estimate: float
    low: float
    high: float
    alpha: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def confidence_sequence(terms: Sequence[float], alpha: float, t_opt: int) -> Interval:
    """The asymptotic confidence sequence of the terms' mean after all of them (see above)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha!r} must be in (0, 1)")
    if t_opt < 1:
        raise ValueError(f"t_opt={t_opt!r} must be >= 1 session")
    x = np.asarray(terms, dtype=float)
    t = len(x)
    if t < 2:
        return Interval(t, float(x.mean()) if t else 0.0, -math.inf, math.inf, alpha)
    rho2 = mixture_rho(alpha, t_opt) ** 2
    radius = float(x.std(ddof=1)) * math.sqrt(2.0 * (t * rho2 + 1.0) / (t * t * rho2)
                                              * math.log(math.sqrt(t * rho2 + 1.0) / alpha))
    mean = float(x.mean())
    return Interval(t, mean, mean - radius, mean + radius, alpha)


def compare_arms(y: Sequence[float], arm: Sequence[int], share: float, alpha: float, t_opt: int) -> Interval:
    """The challenger-minus-champion difference of a per-session metric, always valid."""
    return confidence_sequence(aipw_terms(y, arm, share), alpha, t_opt)
