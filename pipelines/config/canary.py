"""``[canary]``: how a challenger is tried on live traffic and decided (pipelines/canary/)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any, Literal

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION


@dataclass(config=SECTION, frozen=True)
class Guardrail:
    """One blocking metric, per session: the challenger is rolled back when it is significantly
    worse than the champion by more than ``tolerance`` (in the metric's own units)."""

    worse: Literal["higher", "lower"] = "higher"  # which direction is worse
    tolerance: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ValueError(f"guardrail tolerance={self.tolerance!r} must be a finite number >= 0")


def _default_guardrails() -> dict[str, Guardrail]:
    # the reward hacks production RL knows (docs/gate.md) and what users feel: every one a rate per
    # session except latency and length, where a tolerance keeps noise-sized changes from blocking
    return {"tool_error_rate": Guardrail("higher"), "dissatisfied_rate": Guardrail("higher"),
            "regenerate_rate": Guardrail("higher"), "abandoned": Guardrail("higher"),
            "latency_p95_s": Guardrail("higher", 0.25), "output_tokens": Guardrail("higher", 8.0)}


@dataclass(config=SECTION, frozen=True)
class CanaryConfig:
    """Share, error rates and budgets of a canary. The test is an always-valid confidence sequence
    (pipelines/canary/sequential.py): it may be checked after every batch of settled sessions."""

    enabled: bool = False                # a candidate that passes the offline gate starts a canary (after
                                         #   the off-policy estimate) instead of taking all traffic. Off by
                                         #   default: at 10% share a canary needs ~2x t_opt sessions
                                         #   (bench/canary.py), days at the demo's ~100 sessions per iteration
    share: float = 0.10                  # the challenger's share of sessions (sticky per conversation)
    alpha: float = 0.05                  # false promotion rate; false rollbacks share another alpha
                                         #   over the reward and the guardrails (Bonferroni)
    min_gain: float = 0.0                # promote only when the lower bound of the reward gain exceeds it
    min_sessions: int = 30               # per arm before any decision: the sequence is asymptotic (CLT)
    t_opt: int = 2000                    # sessions where the sequence is tightest (its ρ); about the
                                         #   traffic a canary is expected to need
    max_sessions: int = 20000            # expire (champion stays) after this many sessions in all
    max_hours: float = 72.0              # ... or after this long without a decision
    guardrails: dict[str, Guardrail] = field(default_factory=_default_guardrails)
    holdout_share: float = 0.05          # with ``enabled``: conversations (hash of the trace) no learner
                                         #   trains on, the slice the off-policy estimate reads
    offpolicy_method: Literal["dr", "snis"] = "dr"  # doubly robust (context-mean reward model) or plain SNIS
    offpolicy_clip: float = 20.0         # importance weight cap: bias toward the champion for variance
    offpolicy_min_ess: float = 30.0      # below this effective sample size the estimate refuses to judge
    offpolicy_max_turns: int = 256       # newest held-back turns scored (one learner forward each)

    def __post_init__(self) -> None:
        if not 0.0 <= self.holdout_share < 1.0:
            raise ValueError(f"canary.holdout_share={self.holdout_share!r} must be in [0, 1), e.g. 0.05")
        if not self.offpolicy_clip > 1.0:
            raise ValueError(f"canary.offpolicy_clip={self.offpolicy_clip!r} must be > 1 (a weight cap; 10-100 is usual)")
        if not self.offpolicy_min_ess >= 1.0:
            raise ValueError(f"canary.offpolicy_min_ess={self.offpolicy_min_ess!r} must be >= 1")
        if self.offpolicy_max_turns < 1:
            raise ValueError(f"canary.offpolicy_max_turns={self.offpolicy_max_turns!r} must be >= 1")
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"canary.share={self.share!r} must be in (0, 1), e.g. 0.1 for 10% of sessions")
        if not 0.0 < self.alpha < 0.5:
            raise ValueError(f"canary.alpha={self.alpha!r} must be in (0, 0.5), e.g. 0.05")
        if not (math.isfinite(self.min_gain) and self.min_gain >= 0):
            raise ValueError(f"canary.min_gain={self.min_gain!r} must be a finite number >= 0")
        for name in ("min_sessions", "t_opt", "max_sessions"):
            if getattr(self, name) < 1:
                raise ValueError(f"canary.{name}={getattr(self, name)!r} must be >= 1")
        if not self.max_hours > 0:
            raise ValueError(f"canary.max_hours={self.max_hours!r} must be > 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
