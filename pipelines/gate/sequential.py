"""Sequential sampling of a primary suite: look, and when the gain is positive but unproven,
draw more samples per item (new seeds) and look again. Pure; the sampler is passed in.

Look l (1-based) uses ``samples_per_item * 2 ** (l - 1)`` samples per item in all (the earlier
samples are kept, the new ones have new seeds), and the paired test at level
``alpha / max_looks``. Bonferroni over the looks: the chance that ANY look falsely declares a
gain is at most the sum of the per-look levels = alpha, whatever the dependence between looks,
so peeking and stopping when it looks good does not inflate false promotions. (A Pocock
constant would be less conservative, but its value assumes equally spaced, normal increments;
doubling the samples of fixed items is neither.)

Stopping, at each look: promote when significant (p_gain < alpha_look and delta >= min_gain);
else stop (reject) when delta <= 0 ("no gain"), when the upper bound of the gain is below
``max(min_gain, futility_gain)`` ("futile"), or at the last look; else continue. Futility stops
only ever turn promotions into rejections, so they cannot add false promotions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from pipelines.gate.stats import Paired, compare

PROMOTE, CONTINUE, NO_GAIN, FUTILE, LAST = "significant", "continue", "no gain", "futile", "last look"

Draw = Callable[[int, int], tuple[np.ndarray, np.ndarray]]
"""``draw(first, count)`` -> (candidate, champion) per-sample scores, each ``[items, count]``, for
sample indices ``first .. first + count - 1`` (the index picks the seed)."""


@dataclass(frozen=True)
class Look:
    look: int             # 1-based
    samples: int          # per item, in all, at this look
    alpha: float          # the level this look tested at
    stats: Paired
    action: str           # one of the constants above

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "stats": self.stats.to_dict()}


def look_alpha(alpha: float, looks: int) -> float:
    """Bonferroni: each of ``looks`` looks tests at alpha / looks."""
    return alpha / looks


def samples_at(look: int, samples_per_item: int) -> int:
    return samples_per_item * 2 ** (look - 1)


def sequential_compare(draw: Draw, *, test: str, confidence: float, samples_per_item: int, looks: int,
                       min_gain: float = 0.0, futility_gain: float = 0.0, n_bootstrap: int = 2000,
                       seed: int = 0) -> list[Look]:
    """Every look taken, the last one decides (its ``action`` is not ``continue``)."""
    alpha = look_alpha(1.0 - confidence, looks)
    out: list[Look] = []
    sum_a = sum_b = None
    have = 0
    for look in range(1, looks + 1):
        total = samples_at(look, samples_per_item)
        a, b = draw(have, total - have)
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        sum_a = a.sum(axis=1) if sum_a is None else sum_a + a.sum(axis=1)
        sum_b = b.sum(axis=1) if sum_b is None else sum_b + b.sum(axis=1)
        have = total
        st = compare(sum_a / total, sum_b / total, test, 1.0 - alpha, n_bootstrap, seed + look - 1)
        if st.p_gain < alpha and st.delta >= min_gain:
            action = PROMOTE
        elif look == looks:
            action = LAST
        elif st.delta <= 0:
            action = NO_GAIN
        elif st.high < max(min_gain, futility_gain):
            action = FUTILE
        else:
            action = CONTINUE
        out.append(Look(look, total, alpha, st, action))
        if action != CONTINUE:
            break
    return out
