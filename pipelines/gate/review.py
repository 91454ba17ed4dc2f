"""What the gate records for people: the gate run's description, the version's "Gate" section and
the few version tags worth searching.

Both descriptions are Markdown the MLflow UI renders first on the page (the run's `Description`,
tag ``mlflow.note.content``; the model version's description): the decision, every reason, the
per-suite table (candidate vs champion, the difference, its lower bound and p), the suites' power,
the behaviour signatures, the off-policy estimate, the learned reward's prediction, and links
between the run and the model version. Numbers live as the run's metrics too (plots, API).

Version tags are for search (``tags.`tracerl.gate.decision` = 'reject'`` in the registry's
search box) and for the code that reads them; everything else is in the description.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from pipelines.gate.side_by_side import ARTIFACT as SIDE_BY_SIDE

if TYPE_CHECKING:
    from pipelines.gate.run import GateResult

RUN_NOTE = "mlflow.note.content"  # the run page's description (mlflow.utils.mlflow_tags.MLFLOW_RUN_NOTE)
MAX_RUN_NOTE = 8000               # MLflow's limit on a run tag's value
DECISION, REASONS, RUN_ID = "tracerl.gate.decision", "tracerl.gate.reasons", "tracerl.gate.run_id"
CONTAMINATION = "tracerl.gate.contamination"  # comma-separated hashes of eval items found in training
BLOCKED_BY = "tracerl.gate.blocked_by"        # the behaviour signatures that blocked it, comma-separated
OFFPOLICY = "tracerl.offpolicy.verdict"       # ok | worse | refuse, with canary.enabled on a pass
# every version tag the gate writes; the learner's are registry.VERSION_TAGS, the alias moves' in promote.py
GATE_TAGS = (DECISION, REASONS, RUN_ID, CONTAMINATION, BLOCKED_BY, OFFPOLICY)
MAX_TAG = 5000


def version_tags(result: GateResult, run_id: str) -> dict[str, str]:
    """The decision's searchable tags (pipelines/deploy/operations.py reads the reasons and the
    contamination mark, the learner's branch choice the contamination mark)."""
    d = result.decision
    tags = {DECISION: d.outcome, REASONS: " | ".join(d.reasons)[:MAX_TAG], RUN_ID: run_id}
    if result.contamination:
        tags[CONTAMINATION] = ",".join(result.contamination)[:MAX_TAG]
    blocked = [sg.name for sg in d.signatures if sg.blocked]
    if blocked:
        tags[BLOCKED_BY] = ",".join(blocked)
    if result.offpolicy is not None:
        tags[OFFPOLICY] = result.offpolicy.verdict
    return tags


def _against(result: GateResult) -> str:
    return f"champion v{result.baseline}" if result.baseline != "base" else "the base model"


def run_description(result: GateResult, suites: list, version_link: str, side_by_side_link: str | None) -> str:
    """The gate run's description: the decision first, with the link to the model version."""
    head = (f"**{result.decision.outcome}**: `{result.tenant}.{result.task}` {version_link} against "
            f"{_against(result)}.")
    text = "\n".join([head, ""] + body(result, suites, side_by_side_link))
    if len(text) > MAX_RUN_NOTE:
        cut = "\n\n(cut here: `gate/decision.json` holds the whole decision)"
        text = text[:MAX_RUN_NOTE - len(cut)] + cut
    return text


def version_section(result: GateResult, suites: list, run_link: str, side_by_side_link: str | None) -> str:
    """The model version's "Gate" section: the same, led by the link to the gate run."""
    head = (f"**{result.decision.outcome}** against {_against(result)}, by {run_link} "
            f"({time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC).")
    return "\n".join([head, ""] + body(result, suites, side_by_side_link))


def body(result: GateResult, suites: list, side_by_side_link: str | None = None) -> list[str]:
    """Reasons, then the numbers as tables (Markdown lines)."""
    d = result.decision
    lines: list[str] = []
    if d.verdicts:  # the numbers at a glance first (the UI folds a long description after a few lines)
        lines += [suite_table_header(), "|---|---|---:|---:|---:|---:|---:|---:|---|"]
        lines += [suite_row(v) for v in d.verdicts]
        conf = d.verdicts[0].stats.confidence
        lines += ["", f"diff = candidate - champion, mean over the items; lower bound: one-sided at "
                      f"{conf:.0%}; p: a primary's p_gain (evidence the candidate is better), a guardrail's "
                      f"p_loss (evidence it is worse).", ""]
    lines += ["Reasons:", ""] + ([f"- {r}" for r in d.reasons] or ["- (none recorded)"])
    if d.verdicts:
        by_name = {s.name: s for s in suites}
        lines += ["", "| suite | samples/item | looks | MDE a priori | MDE observed | items (fingerprint) |",
                  "|---|---:|---:|---:|---:|---|"]
        lines += [f"| {v.suite} | {v.samples} | {len(v.looks) or 1} | {v.mde:.3f} | {v.mde_observed:.3f} | "
                  f"`{by_name[v.suite].fingerprint[:16] if v.suite in by_name else '?'}` |" for v in d.verdicts]
    if d.signatures:
        lines += ["", "| behaviour signature | candidate | champion | p (rise) | blocked |", "|---|---:|---:|---:|---|"]
        lines += [f"| {sg.name} | {sg.candidate:.3f} | {sg.champion:.3f} | {_p(sg.p_rise)} | "
                  f"{'**yes**' if sg.blocked else 'no'} |" for sg in d.signatures]
    if result.offpolicy is not None:
        op, est = result.offpolicy, result.offpolicy.estimate
        lines += ["", f"Off-policy estimate ({op.verdict}): {est.value:.3f} ± {est.se:.3f} against the champion's "
                      f"{op.champion_value:.3f} (ESS {est.ess:.1f} of {est.n} turns); {op.reason}."]
    if result.predicted_gain is not None:
        measured = "not measured" if result.measured_gain is None else f"{result.measured_gain:+.3f}"
        lines += ["", f"Learned reward: the learner's reward model predicted {result.predicted_gain:+.3f} "
                      f"(mean P(liked)); the private evals measured {measured} (smallest primary delta)."]
    if result.reused and any(result.reused.values()):
        lines += ["", "Replies reused from earlier gates (same weights, items and seeds): "
                      + ", ".join(f"{arm} {n}" for arm, n in result.reused.items()) + "."]
    if result.side_by_side:
        n = len(next(iter(result.side_by_side.values()), []))
        where = f"[{SIDE_BY_SIDE}]({side_by_side_link})" if side_by_side_link else f"`{SIDE_BY_SIDE}`"
        lines += ["", f"Side by side: {where}, {n} recent real prompts answered by both models (a table in "
                      f"the run's Artifacts; click a cell to read its full text)."]
    return lines


def suite_table_header() -> str:
    return "| suite | role | items | candidate | champion | diff | lower bound | p | passed |"


def suite_row(v: Any) -> str:
    st = v.stats
    p = st.p_gain if v.role == "primary" else st.p_loss
    return (f"| {v.suite} | {v.role} | {st.n} | {st.candidate_mean:.3f} | {st.champion_mean:.3f} | {st.delta:+.3f} | "
            f"{st.low:+.3f} | {_p(p)} | {'yes' if v.passed else '**no**'} |")


def _p(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else "-"
