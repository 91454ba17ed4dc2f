"""Reward rules as pure functions: one signal in, one component value out.

These are the readable definition of the spec's semantics. The plain-Python
reference (`reference.py`) is built from them; the SQL engine (`sql.py`) is an
independent, vectorized implementation that tests and the benchmark hold
equal to it. Every component is on [-1, 1]; None means "no signal".

Ordering ("last wins"): signals of one family for one turn are ordered by
(event_time, ingested_at, event_id); the greatest wins. So thumbs up then
thumbs down is a thumbs down, and an accept later reverted is a reject.
"""

from __future__ import annotations

from typing import Iterable

from pipelines.lake.tables import COMPONENTS
from pipelines.reward.spec import COST_COMPONENTS, EXPLICIT_COMPONENTS, Discounted, LastTurn, RewardSpec, Uniform

OUTPUT_KINDS = ("accept", "edit", "reject")
TOOL_OUTCOMES = ("ok", "timeout", "error", "invalid_arguments")
WHITESPACE = " \t\r\n"    # exactly these, as in the SQL engine (not Unicode whitespace)


def thumbs(value: float | None) -> float | None:
    """+1 for up, -1 for down; 0 or missing is no signal."""
    if value is None or value == 0:
        return None
    return 1.0 if value > 0 else -1.0


def rating(value: float | None, lo: float | None, hi: float | None, spec: RewardSpec) -> float | None:
    """Linear map of [lo, hi] onto [-1, 1]; the event's scale wins over the spec's default.

    Not clamped: a value outside its scale is a client bug, and the bounds check
    must see it rather than have it silently folded into range.
    """
    if value is None:
        return None
    lo = spec.explicit.rating_min if lo is None else lo
    hi = spec.explicit.rating_max if hi is None else hi
    if not hi > lo:
        return None
    return 2.0 * (value - lo) / (hi - lo) - 1.0


def output(kind: str | None, spec: RewardSpec) -> float | None:
    """The last of accept / edit / reject."""
    return None if kind is None else getattr(spec.implicit, kind)


def regenerate(any_regenerate: bool, spec: RewardSpec) -> float | None:
    """Presence, not count: a double click is one regenerate."""
    return spec.implicit.regenerate if any_regenerate else None


def follow_up(sentiment: str | None, spec: RewardSpec) -> float | None:
    """The last satisfied/dissatisfied follow-up; neutral ones carry no signal."""
    if sentiment == "satisfied":
        return spec.implicit.satisfied
    if sentiment == "dissatisfied":
        return spec.implicit.dissatisfied
    return None


def tool(outcomes: Iterable[str], spec: RewardSpec) -> float | None:
    """The worst outcome among the turn's calls (unknown outcomes ignored)."""
    t = spec.tools
    values = {"ok": t.ok, "timeout": t.timeout, "error": t.error, "invalid_arguments": t.invalid_arguments}
    scores = [values[o] for o in outcomes if o in values]
    return min(scores) if scores else None


def retries(n_retries: int, n_calls: int, spec: RewardSpec) -> float | None:
    """-min(retries, cap) / cap; None when the turn made no call."""
    if n_calls == 0:
        return None
    return -min(n_retries, spec.tools.retry_cap) / spec.tools.retry_cap


def latency(latency_ms: float | None, spec: RewardSpec) -> float | None:
    if latency_ms is None or spec.weights.latency == 0:
        return None
    return -min(max(latency_ms, 0.0) / spec.costs.latency_budget_ms, 1.0)


def length(chars: int | None, spec: RewardSpec) -> float | None:
    if chars is None or spec.weights.length == 0:
        return None
    return -min(chars / spec.costs.length_budget_chars, 1.0)


HINDSIGHT_KINDS = ("complaint", "reask", "thanks", "new_topic")


def hindsight(kind: str | None, confidence: float | None, regenerated: bool, follow_sentiment: str | None,
              spec: RewardSpec) -> float | None:
    """The spec's value of the next user message's kind x its confidence (`hindsight.classify`), when
    confident enough; None where the kind is valued 0, or the turn already has the same evidence
    explicitly: a re-ask beside a `regenerate`, a complaint / thanks beside a follow-up sentiment."""
    if kind not in HINDSIGHT_KINDS or confidence is None or confidence < spec.hindsight.min_confidence:
        return None
    if kind == "reask" and regenerated:
        return None
    if kind in ("complaint", "thanks") and follow_sentiment in ("satisfied", "dissatisfied"):
        return None
    v = getattr(spec.hindsight, kind)
    return v * confidence if v != 0 else None


def text_class(text: str | None) -> str | None:
    """'empty', 'question' (ends with '?'), or None; decided once at extraction."""
    if text is None or not text.strip(WHITESPACE):
        return "empty"
    return "question" if text.rstrip(WHITESPACE).endswith("?") else None


def dodge(cls: str | None, chars: int, n_calls: int, spec: RewardSpec) -> str | None:
    """'silent' or 'clarify' when the turn neither answered nor acted; None otherwise."""
    if spec.dodge.cap is None or n_calls > 0:
        return None
    if cls == "empty":
        return "silent"
    if cls == "question" and chars <= spec.dodge.clarify_max_chars:
        return "clarify"
    return None


def session_share(turn_index: int, last_index: int, spec: RewardSpec) -> float | None:
    """Share of a session-level outcome credited to one turn (None: no credit)."""
    c = spec.credit
    if isinstance(c, LastTurn):
        return 1.0 if turn_index == last_index else None
    if isinstance(c, Uniform):
        return 1.0
    assert isinstance(c, Discounted)
    share = c.gamma ** (last_index - turn_index)
    return share if share >= c.min_share else None


def session_values(outcome: str | None, success: bool | None, spec: RewardSpec) -> tuple[float | None, float | None]:
    """(abandon, session) before credit assignment."""
    abandon = spec.implicit.abandoned if outcome == "abandoned" else None
    session = None if success is None else (spec.implicit.success if success else spec.implicit.failure)
    return abandon, session


def explicit_positive(components: dict[str, float | None]) -> bool:
    """The user liked the reply (thumbs, rating) or acted on it (accept / edit kept): component > 0."""
    return any((components.get(k) or 0.0) > 0 for k in EXPLICIT_COMPONENTS)


def combine(components: dict[str, float | None], dodge_kind: str | None,
            spec: RewardSpec) -> tuple[bool, float | None]:
    """(labelled, total). Unlabelled turns get None, never 0: they carry no preference.

    Labels come from feedback, session outcomes and tool failures; an ok tool call
    and the cost terms only adjust a turn that is labelled otherwise. A dodge is
    labelled and capped at `dodge.cap`, unless `dodge.explicit_overrides` and the
    user gave an explicit positive: that turn keeps its ordinary weighted sum.
    """
    labelled = any(components.get(k) is not None for k in COMPONENTS
                   if k not in COST_COMPONENTS and k not in ("tool", "retries"))
    labelled = labelled or any((components.get(k) or 0.0) < 0 for k in ("tool", "retries"))
    total = None
    if labelled:
        total = 0.0
        for k in COMPONENTS:
            v = components.get(k)
            if v is not None:
                total += getattr(spec.weights, k) * v
    if dodge_kind is not None and not (spec.dodge.explicit_overrides and explicit_positive(components)):
        cap = spec.dodge.cap
        total = cap if total is None else min(total, cap)
        labelled = True
    return labelled, total
