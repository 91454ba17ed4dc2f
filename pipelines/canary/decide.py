"""The canary's decision from settled sessions: promote, roll back, expire, or keep going. Pure.

Each check looks at every settled session so far (arrival order), so it may run after every
batch: the confidence sequences (sequential.py) hold at all times at once.

- **roll back** when the reward is significantly worse, or any guardrail is significantly worse
  by more than its tolerance. The reward and the k guardrails share ``alpha`` (each at
  alpha / (k + 1)), so an A/A canary is rolled back falsely at most ``alpha`` of the time;
- **promote** when the reward gain's lower bound exceeds ``min_gain`` (at ``alpha``) and no
  rollback rule fired;
- **expire** at ``max_sessions`` or ``max_hours`` without either: the champion stays;
- else **continue**. Nothing is decided before ``min_sessions`` per arm (the sequences are
  asymptotic). The two-sided sequences are used one side at a time, so each error rate is at
  most its alpha (conservative by up to half).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from pipelines.canary.sequential import Interval, aipw_terms, compare_arms, confidence_sequence
from pipelines.config.canary import CanaryConfig

PROMOTE, ROLLBACK, EXPIRE, CONTINUE = "promote", "rollback", "expire", "continue"
CHAMPION_ARM, CHALLENGER_ARM = 0, 1


@dataclass(frozen=True)
class Session:
    """One settled session of the canary: which arm served it, its reward (mean over its turns)
    and its guardrail metrics (a metric it lacks is left out of that metric's test)."""

    arm: int
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class CanaryDecision:
    outcome: str
    reasons: list[str]
    sessions: tuple[int, int]                 # (champion, challenger)
    reward: Interval | None = None            # challenger - champion, at alpha
    guardrails: dict[str, Interval] = field(default_factory=dict)  # at alpha / (k + 1)

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "reasons": self.reasons, "sessions": list(self.sessions),
                "reward": self.reward.to_dict() if self.reward else None,
                "guardrails": {k: v.to_dict() for k, v in self.guardrails.items()}}


def decide(sessions: Sequence[Session], cfg: CanaryConfig, hours: float) -> CanaryDecision:
    arms = np.array([s.arm for s in sessions], dtype=int)
    counts = (int((arms == CHAMPION_ARM).sum()), int((arms == CHALLENGER_ARM).sum()))
    expired = len(sessions) >= cfg.max_sessions or hours >= cfg.max_hours
    budget = f"{len(sessions)} sessions of max {cfg.max_sessions}, {hours:.1f} h of max {cfg.max_hours:g} h"
    if min(counts) < cfg.min_sessions:
        why = f"{min(counts)} sessions on the smaller arm < canary.min_sessions={cfg.min_sessions}"
        return CanaryDecision(EXPIRE if expired else CONTINUE, [why + (f"; expired: {budget}" if expired else "")],
                              counts)
    k = len(cfg.guardrails)
    strict = cfg.alpha / (k + 1)
    terms = aipw_terms([s.reward for s in sessions], arms, cfg.share)  # one set of terms, two levels
    gain = confidence_sequence(terms, cfg.alpha, cfg.t_opt)
    loss = confidence_sequence(terms, strict, cfg.t_opt)
    out = CanaryDecision(CONTINUE, [], counts, gain)
    if loss.high < 0:
        out.reasons.append(f"reward: challenger worse by {-loss.estimate:.3f} (difference at most "
                           f"{loss.high:+.3f}, always-valid at {1 - strict:.2%})")
    for name, g in cfg.guardrails.items():
        rows = [(s.metrics[name], s.arm) for s in sessions if name in s.metrics]
        if len({a for _, a in rows}) < 2:
            continue
        y, a = zip(*rows)
        iv = compare_arms(y, a, cfg.share, strict, cfg.t_opt)
        out.guardrails[name] = iv
        bad = iv.low > g.tolerance if g.worse == "higher" else iv.high < -g.tolerance
        if bad:
            out.reasons.append(f"guardrail {name}: challenger {'higher' if g.worse == 'higher' else 'lower'} by "
                               f"{abs(iv.estimate):.3f} (bounds [{iv.low:+.3f}, {iv.high:+.3f}], tolerance "
                               f"{g.tolerance:g}, always-valid at {1 - strict:.2%})")
    if out.reasons:
        out.outcome = ROLLBACK
    elif gain.low > cfg.min_gain:
        out.outcome = PROMOTE
        out.reasons.append(f"reward: challenger better by {gain.estimate:+.3f} (at least {gain.low:+.3f}, "
                           f"always-valid at {1 - cfg.alpha:.0%}); no guardrail worse")
    elif expired:
        out.outcome = EXPIRE
        out.reasons.append(f"no decision within the budget ({budget}): reward difference in "
                           f"[{gain.low:+.3f}, {gain.high:+.3f}]; the champion stays")
    else:
        out.reasons.append(f"undecided: reward difference in [{gain.low:+.3f}, {gain.high:+.3f}] after {budget}")
    return out
