"""The decision: promote iff every primary suite gains significantly and no guardrail regresses.

Primary suite: significant gain = ``p_gain < 1 - confidence`` (bootstrap: the one-sided
lower bound of the mean gain is > 0) and ``delta >= min_gain``.
Guardrail suite (non-inferiority): fails if the drop may exceed its tolerance.
  bootstrap: the one-sided lower bound of delta < -tolerance (we cannot rule out a drop larger
  than tolerance);  sign: the candidate is significantly worse (p_loss < alpha) and the mean
  dropped by more than tolerance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pipelines.gate.config import GateConfig
from pipelines.gate.stats import Paired

PROMOTE, REJECT, HOLD = "promote", "reject", "hold"


@dataclass
class SuiteVerdict:
    suite: str
    role: str
    passed: bool
    reason: str
    stats: Paired
    tolerance: float = 0.0


@dataclass
class Decision:
    outcome: str                 # promote | reject | hold (passed, waiting for a person)
    reasons: list[str]
    verdicts: list[SuiteVerdict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.outcome in (PROMOTE, HOLD)

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "reasons": self.reasons,
                "suites": [{**asdict(v), "stats": v.stats.to_dict()} for v in self.verdicts]}


def judge_suite(name: str, role: str, tolerance: float, st: Paired, gate: GateConfig) -> SuiteVerdict:
    alpha = 1.0 - gate.confidence
    where = f"{role} suite {name!r} (n={st.n}, {st.test})"
    if role == "primary":
        ok = st.p_gain < alpha and st.delta >= gate.min_gain
        why = (f"{where}: gain {st.delta:+.4f} (champion {st.champion_mean:.4f} -> candidate {st.candidate_mean:.4f}), "
               f"lower bound {st.low:+.4f}, p_gain={st.p_gain:.4f} {'<' if st.p_gain < alpha else '>='} alpha={alpha:.3f}")
        if ok:
            return SuiteVerdict(name, role, True, why + ": significant", st, tolerance)
        extra = f"; below min_gain={gate.min_gain}" if st.delta < gate.min_gain else ""
        return SuiteVerdict(name, role, False, why + f": no significant gain{extra}", st, tolerance)
    if st.test == "bootstrap":
        bad = st.low < -tolerance
        rule = f"lower bound {st.low:+.4f} {'<' if bad else '>='} -tolerance={-tolerance:+.4f}"
    else:
        bad = st.p_loss < alpha and st.delta < -tolerance
        rule = f"p_loss={st.p_loss:.4f}, delta {st.delta:+.4f} vs -tolerance={-tolerance:+.4f}"
    why = f"{where}: delta {st.delta:+.4f} ({st.champion_mean:.4f} -> {st.candidate_mean:.4f}), {rule}"
    return SuiteVerdict(name, role, not bad, why + (": regression beyond tolerance" if bad else ": no regression"),
                        st, tolerance)


def kl_check(kl: float | None, gate: GateConfig) -> tuple[bool, str]:
    """The KL budget: the learner's last-step KL(k3) to the base model vs ``gate.max_kl``."""
    if gate.max_kl is None:
        return True, "KL budget off (gate.max_kl=None)"
    if kl is None or kl != kl:  # missing or NaN
        return True, f"no KL recorded for this adapter; budget max_kl={gate.max_kl} not checked"
    if kl > gate.max_kl:
        return False, f"KL to base {kl:.4f} > gate.max_kl={gate.max_kl}: drifted too far (over-optimization)"
    return True, f"KL to base {kl:.4f} <= gate.max_kl={gate.max_kl}"


def decide(verdicts: list[SuiteVerdict], gate: GateConfig, kl: float | None = None) -> Decision:
    primaries = [v for v in verdicts if v.role == "primary"]
    kl_ok, kl_reason = kl_check(kl, gate)
    failed = [v.reason for v in verdicts if not v.passed] + ([] if kl_ok else [kl_reason])
    if not primaries:
        return Decision(REJECT, ["no primary suite: nothing can show a gain; add a suite with role = \"primary\""],
                        verdicts)
    if failed:
        return Decision(REJECT, failed, verdicts)
    reasons = [v.reason for v in verdicts] + [kl_reason]
    if gate.review:
        return Decision(HOLD, reasons + [f"review mode: waiting for tag {gate.approval_tag}=true on the version"],
                        verdicts)
    return Decision(PROMOTE, reasons, verdicts)
