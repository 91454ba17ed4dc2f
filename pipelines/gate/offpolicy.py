"""Off-policy estimate of a candidate's live reward from logged turns. Pure (numpy); the caller
brings the logprobs (pipelines/gate/live_estimate.py: the held-back slice and a learner forward). docs/canary.md.

Each logged turn i: a context x_i (the conversation so far), the reply y_i the behaviour policy
q served, its reward r_i, and log q(y_i|x_i) (the sum of the logged token logprobs). The
candidate π scores the same reply: log π(y_i|x_i). The sequence importance weight is

    w_i = min(π(y_i|x_i) / q(y_i|x_i), clip)

- **Self-normalised IS** (SNIS): V = Σ w_i r_i / Σ w_i. Biased O(1/n), but bounded by the
  rewards' range and far less variable than plain IS, whose weights for a 48-token reply span
  many orders of magnitude. Standard error by the delta method:
  SE² = Σ w_i² (r_i − V)² / (Σ w_i)².
- **Doubly robust** (Dudík et al. 2011), self-normalised: V = mean(v̂_i) + Σ w_i (r_i − q̂_i) / Σ w_i,
  with q̂_i a reward model's prediction for the logged reply and v̂_i its expected value under
  the candidate at x_i. With a model independent of the reply (a per-context mean), v̂ = q̂ and
  the model is a control variate: it removes the between-context share of the variance. Unbiased
  if either the weights or the model are right (for the SNIS part: asymptotically).
- **Effective sample size**: ESS = (Σ w)² / Σ w². When the candidate moved far from what
  served, a few turns carry all the weight and ESS collapses; below ``min_ess`` the estimate
  says nothing and the verdict is "refuse", never a decision.

Assumptions (the estimate is only as good as these): q is the policy that really sampled y_i
(vLLM's raw logprobs at the logged temperature, top_p 1; a turn without logprobs is left out);
π puts mass wherever it is compared (a reply π cannot produce gets w = 0, fine); rewards of a
turn do not depend on which policy served the other turns of its session (they do a little:
later turns see earlier replies; the estimate treats turns as independent draws); the logged
turns are not ones the candidate trained on (its weights would be inflated by fitting them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

OK, WORSE, REFUSE = "ok", "worse", "refuse"


def importance_weights(target_logprobs: Sequence[float], behaviour_logprobs: Sequence[float],
                       clip: float) -> np.ndarray:
    """w_i = min(exp(log π − log q), clip), computed in log space (no overflow for long replies)."""
    if not clip > 0:
        raise ValueError(f"clip={clip!r} must be > 0 (a weight cap; 10-100 is usual)")
    lp, lq = np.asarray(target_logprobs, dtype=float), np.asarray(behaviour_logprobs, dtype=float)
    if lp.shape != lq.shape:
        raise ValueError(f"{lp.shape[0]} target logprobs for {lq.shape[0]} behaviour logprobs: one each per turn")
    if not (np.isfinite(lq).all() and (lp < np.inf).all()):
        raise ValueError("behaviour logprobs must be finite and target logprobs < +inf (log-probabilities)")
    return np.exp(np.minimum(lp - lq, np.log(clip)))


def effective_sample_size(weights: np.ndarray) -> float:
    """(Σ w)² / Σ w²: n for equal weights, 1 when one turn holds all the weight, 0 for none."""
    w = np.asarray(weights, dtype=float)
    s2 = float((w * w).sum())
    return float(w.sum()) ** 2 / s2 if s2 > 0 else 0.0


@dataclass(frozen=True)
class Estimate:
    """One policy value estimate from n logged turns."""

    method: str        # "snis" | "dr"
    value: float
    se: float
    ess: float
    n: int
    clipped: int       # turns whose weight hit the clip

    def bounds(self, z: float) -> tuple[float, float]:
        return self.value - z * self.se, self.value + z * self.se

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def snis(rewards: Sequence[float], weights: np.ndarray, clip: float | None = None) -> Estimate:
    """Self-normalised importance sampling with the delta-method standard error."""
    r, w = _check(rewards, weights)
    total = float(w.sum())
    if total <= 0:
        return Estimate("snis", float("nan"), float("inf"), 0.0, len(r), 0)
    v = float((w * r).sum() / total)
    se = float(np.sqrt((w * w * (r - v) ** 2).sum()) / total)
    return Estimate("snis", v, se, effective_sample_size(w), len(r), _clipped(w, clip))


def doubly_robust(rewards: Sequence[float], weights: np.ndarray, predicted_logged: Sequence[float],
                  predicted_target: Sequence[float], clip: float | None = None) -> Estimate:
    """Self-normalised DR: the model's value under the candidate plus the weighted residuals.
    SE from the per-turn terms v̂_i + n·w_i(r_i − q̂_i)/Σw (their sample sd / √n)."""
    r, w = _check(rewards, weights)
    qh, vh = np.asarray(predicted_logged, dtype=float), np.asarray(predicted_target, dtype=float)
    if qh.shape != r.shape or vh.shape != r.shape:
        raise ValueError(f"reward model predictions: {qh.shape[0]} logged and {vh.shape[0]} target for "
                         f"{r.shape[0]} turns; one each per turn")
    total = float(w.sum())
    if total <= 0:
        return Estimate("dr", float("nan"), float("inf"), 0.0, len(r), 0)
    terms = vh + len(r) * w * (r - qh) / total
    v = float(terms.mean())
    se = float(terms.std(ddof=1) / np.sqrt(len(r))) if len(r) > 1 else float("inf")
    return Estimate("dr", v, se, effective_sample_size(w), len(r), _clipped(w, clip))


def context_means(rewards: Sequence[float], contexts: Sequence[str], prior_weight: float = 1.0) -> np.ndarray:
    """The simplest reward model fit on the lake: each turn's context mean reward, shrunk to the
    overall mean with ``prior_weight`` pseudo-turns, leaving the turn itself out (so the model
    never sees the residual it is subtracted from). Reply-independent: q̂ = v̂ for any policy."""
    r = np.asarray(rewards, dtype=float)
    if len(contexts) != len(r):
        raise ValueError(f"{len(contexts)} contexts for {len(r)} rewards")
    overall = float(r.mean()) if len(r) else 0.0
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for c, x in zip(contexts, r):
        sums[c] = sums.get(c, 0.0) + float(x)
        counts[c] = counts.get(c, 0) + 1
    return np.array([(sums[c] - x + prior_weight * overall) / (counts[c] - 1 + prior_weight)
                     for c, x in zip(contexts, r)])


@dataclass(frozen=True)
class OffPolicyVerdict:
    """Should the candidate enter the canary? ``worse``: its estimate is significantly below the
    champion's logged reward (one-sided at ``alpha``); ``refuse``: too little overlap (ESS) to say."""

    verdict: str       # OK | WORSE | REFUSE
    reason: str
    estimate: Estimate
    champion_value: float
    champion_se: float
    low: float         # lower bound of the difference candidate - champion
    high: float        # upper bound

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "estimate": self.estimate.to_dict()}


def judge(estimate: Estimate, champion_rewards: Sequence[float], *, alpha: float, min_ess: float) -> OffPolicyVerdict:
    """Compare the candidate's estimate with the champion's own logged mean reward (its traffic
    in the same held-back slice: on-policy, so its plain mean and SE)."""
    c = np.asarray(champion_rewards, dtype=float)
    cv = float(c.mean()) if len(c) else float("nan")
    cse = float(c.std(ddof=1) / np.sqrt(len(c))) if len(c) > 1 else float("inf")
    z = NormalDist().inv_cdf(1.0 - alpha)
    d, se = estimate.value - cv, float(np.hypot(estimate.se, cse))
    low, high = d - z * se, d + z * se
    if not estimate.ess >= min_ess or not np.isfinite(se):
        return OffPolicyVerdict(REFUSE, f"effective sample size {estimate.ess:.1f} of {estimate.n} turns < "
                                        f"min_ess {min_ess:g}: the candidate's replies are too unlike what "
                                        f"served to estimate it", estimate, cv, cse, low, high)
    if high < 0:
        return OffPolicyVerdict(WORSE, f"estimated live reward {estimate.value:.3f} ± {estimate.se:.3f} "
                                       f"({estimate.method}, ESS {estimate.ess:.0f}) is below the champion's "
                                       f"{cv:.3f}: difference at most {high:+.3f} at {1 - alpha:.0%}",
                                estimate, cv, cse, low, high)
    return OffPolicyVerdict(OK, f"estimated live reward {estimate.value:.3f} ± {estimate.se:.3f} "
                                f"({estimate.method}, ESS {estimate.ess:.0f}) vs champion {cv:.3f}: "
                                f"difference in [{low:+.3f}, {high:+.3f}]", estimate, cv, cse, low, high)


def _check(rewards: Sequence[float], weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r, w = np.asarray(rewards, dtype=float), np.asarray(weights, dtype=float)
    if r.shape != w.shape or r.ndim != 1 or len(r) == 0:
        raise ValueError(f"{r.size} rewards for {w.size} weights: need one weight per turn and at least one turn")
    if not (np.isfinite(r).all() and np.isfinite(w).all() and (w >= 0).all()):
        raise ValueError("rewards and weights must be finite, weights >= 0")
    return r, w


def _clipped(w: np.ndarray, clip: float | None) -> int:
    return int((w >= clip * (1 - 1e-12)).sum()) if clip is not None else 0
