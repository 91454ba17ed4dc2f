"""The decision: promote iff every primary suite gains significantly, no guardrail regresses, no
behaviour signature rises and the KL budget holds.

Primary suite: significant gain = ``p_gain < alpha`` (bootstrap: the one-sided lower bound of
the mean gain is > 0) and ``delta >= min_gain``; alpha is the level the test ran at (with
sequential looks, ``(1 - confidence) / max_looks``, see sequential.py).
Guardrail suite (non-inferiority): fails if the drop may exceed its tolerance.
  bootstrap: the one-sided lower bound of delta < -tolerance (we cannot rule out a drop larger
  than tolerance);  sign: the candidate is significantly worse (p_loss < alpha) and the mean
  dropped by more than tolerance.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from pipelines.gate import power as pw
from pipelines.config.gate import GateConfig
from pipelines.gate.sequential import Look
from pipelines.gate.signatures import SignatureVerdict
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
    samples: int = 1               # per item, at the deciding look
    mde: float = 0.0               # a priori MDE (power.py) at the deciding look's level and samples
    mde_observed: float = 0.0      # a posteriori, from the observed sd of d
    looks: list[Look] = field(default_factory=list)
    warning: str | None = None     # the suite is too small (mde > gate.max_mde): logged, not blocking


@dataclass
class Decision:
    outcome: str                 # promote | reject | hold (passed, waiting for a person)
    reasons: list[str]
    verdicts: list[SuiteVerdict] = field(default_factory=list)
    signatures: list[SignatureVerdict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.outcome in (PROMOTE, HOLD)

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "reasons": self.reasons, "warnings": self.warnings,
                "suites": [{**asdict(v), "stats": v.stats.to_dict(), "looks": [x.to_dict() for x in v.looks]}
                           for v in self.verdicts],
                "signatures": [x.to_dict() for x in self.signatures]}


def power_note(name: str, st: Paired, gate: GateConfig, samples: int, looks: int) -> tuple[float, float, str, str | None]:
    """(mde, mde_observed, text for the reason, warning or None) of one suite.

    ``mde`` is a priori at the most the gate can do for this suite: the last look's level
    (alpha / looks) and samples (``samples`` is what the deciding look had); the champion's
    observed mean sets the variance (power.py)."""
    alpha_used = 1.0 - st.confidence
    most = gate.samples_per_item * 2 ** (looks - 1)
    alpha_last = (1.0 - gate.confidence) / looks
    prior = pw.mde_prior(st.n, most, alpha_last, gate.power, st.champion_mean)
    observed = pw.mde(st.sd, st.n, alpha_used, gate.power)
    text = (f"MDE at power {gate.power:.2f}: {prior:.3f} a priori ({most} sample(s)/item), "
            f"{observed:.3f} observed ({samples} sample(s)/item, sd(d)={st.sd:.3f})")
    warning = None
    if prior > gate.max_mde:
        need = pw.items_for(gate.max_mde, most, alpha_last, gate.power, st.champion_mean)
        per = f"{gate.samples_per_item} sample/item" if gate.samples_per_item == 1 else f"{gate.samples_per_item} samples/item"
        over = f", up to {most} over {looks} looks" if looks > 1 else ""
        warning = (f"suite {name} (n={st.n}, {per}{over}) can only detect gains >= {prior:.2f} "
                   f"(gate.max_mde={gate.max_mde}, power {gate.power:.2f}); add items (~{need} for {gate.max_mde}) "
                   f"or raise gate.samples_per_item" + ("" if gate.temperature > 0 else " with temperature > 0"))
    return prior, observed, text, warning


def judge_suite(name: str, role: str, tolerance: float, st: Paired, gate: GateConfig, *, samples: int | None = None,
                looks: list[Look] | None = None) -> SuiteVerdict:
    alpha = 1.0 - st.confidence
    samples = gate.samples_per_item if samples is None else samples
    looks = looks or []
    where = f"{role} suite {name!r} (n={st.n}, {st.test})"
    if role == "primary":
        prior, observed, ptext, warning = power_note(name, st, gate, samples, gate.looks)
        ok = st.p_gain < alpha and st.delta >= gate.min_gain
        seq = ""
        if looks:
            seq = (f", look {looks[-1].look}/{gate.looks} ({samples} sample(s)/item, "
                   f"{looks[-1].action}; Bonferroni alpha/{gate.looks})")
        why = (f"{where}: gain {st.delta:+.4f} (champion {st.champion_mean:.4f} -> candidate {st.candidate_mean:.4f}), "
               f"lower bound {st.low:+.4f}, p_gain={st.p_gain:.4f} {'<' if st.p_gain < alpha else '>='} alpha={alpha:.4f}"
               f"{seq}; {ptext}")
        if ok:
            return SuiteVerdict(name, role, True, why + ": significant", st, tolerance, samples, prior, observed,
                                looks, warning)
        extra = f"; below min_gain={gate.min_gain}" if st.delta < gate.min_gain else ""
        return SuiteVerdict(name, role, False, why + f": no significant gain{extra}", st, tolerance, samples, prior,
                            observed, looks, warning)
    if st.test == "bootstrap":
        bad = st.low < -tolerance
        rule = f"lower bound {st.low:+.4f} {'<' if bad else '>='} -tolerance={-tolerance:+.4f}"
    else:
        bad = st.p_loss < alpha and st.delta < -tolerance
        rule = f"p_loss={st.p_loss:.4f}, delta {st.delta:+.4f} vs -tolerance={-tolerance:+.4f}"
    prior, observed, ptext, _ = power_note(name, st, gate, samples, 1)
    why = f"{where}: delta {st.delta:+.4f} ({st.champion_mean:.4f} -> {st.candidate_mean:.4f}), {rule}; {ptext}"
    return SuiteVerdict(name, role, not bad, why + (": regression beyond tolerance" if bad else ": no regression"),
                        st, tolerance, samples, prior, observed)


def kl_check(kl: float | None, gate: GateConfig) -> tuple[bool, str]:
    """The KL budget: the learner's last-step KL(k3) to the base model vs ``gate.max_kl``."""
    if gate.max_kl is None:
        return True, "KL budget off (gate.max_kl=None)"
    if kl is None or kl != kl:  # missing or NaN
        return True, f"no KL recorded for this adapter; budget max_kl={gate.max_kl} not checked"
    if kl > gate.max_kl:
        return False, f"KL to base {kl:.4f} > gate.max_kl={gate.max_kl}: drifted too far (over-optimization)"
    return True, f"KL to base {kl:.4f} <= gate.max_kl={gate.max_kl}"


def decide(verdicts: list[SuiteVerdict], gate: GateConfig, kl: float | None = None,
           signatures: list[SignatureVerdict] | None = None) -> Decision:
    """Reasons: the failures (reject) or every check (promote/hold), then the warnings
    (``warning: ...``, too-small suites), which never block by themselves."""
    signatures = list(signatures or [])
    primaries = [v for v in verdicts if v.role == "primary"]
    kl_ok, kl_reason = kl_check(kl, gate)
    warnings = [v.warning for v in verdicts if v.warning]
    notes = [f"warning: {w}" for w in warnings]
    failed = ([v.reason for v in verdicts if not v.passed] + [s.reason for s in signatures if s.blocked]
              + ([] if kl_ok else [kl_reason]))
    if not primaries:
        return Decision(REJECT, ["no primary suite: nothing can show a gain; add a suite with role = \"primary\""],
                        verdicts, signatures, warnings)
    if failed:
        return Decision(REJECT, failed + notes, verdicts, signatures, warnings)
    reasons = [v.reason for v in verdicts] + [s.reason for s in signatures] + [kl_reason]
    if gate.review:
        return Decision(HOLD, reasons + [f"review mode: waiting for tag {gate.approval_tag}=true on the version"] + notes,
                        verdicts, signatures, warnings)
    return Decision(PROMOTE, reasons + notes, verdicts, signatures, warnings)


def predicted_vs_measured(predicted: float | None, predicted_se: float | None, verdicts: list[SuiteVerdict],
                          confidence: float) -> tuple[float | None, str | None]:
    """(the gain the private evals measured, a warning or None) beside the gain the learner's learned
    reward predicted (pipelines/train/predicted_gain.py). Measured: the smallest primary delta
    (promotion needs every primary). The warning says when the two disagree beyond their noise: the
    prediction's one-sided lower bound is above 0 and above the evals' upper bound, the signature of a
    learned reward over-optimised. Never changes the outcome: the gate decides on the evals."""
    from statistics import NormalDist

    primaries = [v for v in verdicts if v.role == "primary"]
    if not primaries:
        return None, None
    v = min(primaries, key=lambda x: x.stats.delta)
    measured = v.stats.delta
    if predicted is None or not math.isfinite(predicted):
        return measured, None
    low = predicted - NormalDist().inv_cdf(confidence) * (predicted_se if predicted_se is not None else 0.0)
    if not low > max(0.0, v.stats.high):
        return measured, None
    return measured, (f"reward model predicted {predicted:+.3f} (mean P(liked), the learner's in-sample estimate, "
                      f"lower bound {low:+.3f}), private evals measured {measured:+.3f} on primary suite "
                      f"{v.suite!r} (upper bound {v.stats.high:+.3f}): the evals rule out the gain its learned "
                      f"reward predicts, which may be over-optimised")
