"""The promotion gate as an asset, `promotion`, downstream of `candidate_adapter`.

Each run gates the candidates its own `candidate_adapter` registered (private eval suites,
candidate vs champion on identical items, a paired test per suite), records the decision in
MLflow and moves the registry aliases. Its checks:

- `no_contamination` (blocking, ERROR): an eval item in a candidate's training data, or a gate
  that could not run, fails the run and `deployment` does not run;
- `candidate_promoted` (WARN): a candidate the gate rejected. A normal rejection does not fail
  the run: `deployment` runs and finds the champion unchanged.

No candidate in the run (or none in the run's `targets`): `promotion` does not materialize, its
checks pass with `candidates = 0`, and `deployment` is skipped in that run. The hourly
`closed_loop_hourly` schedule runs `deployment` on its own when there is nothing to train.
"""

import dagster as dg

from assets.resources import TargetsConfig, TracerlResource
from pipelines.config import TracerlConfig
from pipelines.gate.run import gate_candidates

NO_CONTAMINATION = "no_contamination"
CANDIDATE_PROMOTED = "candidate_promoted"
PASSED = ("promote", "hold")


class PromotionRunConfig(TargetsConfig):
    """targets: "tenant/task" to gate; empty: every candidate of this run."""


def eval_summary(decision: dict) -> dict[str, dict]:
    """Per-suite figures of one decision (role, candidate, champion, delta, low, passed), where the
    gate's summary carries them: not for contamination, errors, or a tenant/task without suites."""
    return {name: dict(figures) for name, figures in (decision.get("suites") or {}).items()}


def champions(cfg: TracerlConfig, pairs: list[tuple[str, str]]) -> dict[str, dict | None]:
    """The champion (registry and adapter version) of each tenant/task, now."""
    from pipelines.gate.promote import alias_version
    from pipelines.registry import CHAMPION

    out = {}
    for tenant, task in pairs:
        mv = alias_version(cfg, tenant, task, CHAMPION)
        out[f"{tenant}/{task}"] = None if mv is None else {
            "registry_version": str(mv.version), "adapter_version": int(mv.tags["adapter_version"])}
    return out


def run_candidates(context: dg.AssetExecutionContext) -> list[dict] | None:
    """The `candidates` metadata of this run's `candidate_adapter`, or None (not produced here)."""
    event = context.instance.get_latest_materialization_event(dg.AssetKey("candidate_adapter"))
    if event is None or event.run_id != context.run.run_id:
        return None
    meta = event.asset_materialization.metadata
    return meta["candidates"].value if "candidates" in meta else []


def _line(d: dict) -> str:
    return f"{d['tenant']}/{d['task']} v{d['registry_version']}: {d['outcome']}: {'; '.join(d['reasons'])}"


def _nothing_gated(note: str):
    """No materialization (so `deployment` is skipped in this run); the checks still report."""
    for name in (NO_CONTAMINATION, CANDIDATE_PROMOTED):
        yield dg.AssetCheckResult(asset_key="promotion", check_name=name, passed=True,
                                  metadata={"candidates": 0, "note": note})


@dg.asset(
    key="promotion",
    deps=["candidate_adapter"],
    group_name="gate",
    kinds={"mlflow"},
    output_required=False,
    description="The gate's decision on each candidate of the run: private eval suites, candidate vs "
                "champion on identical items in vLLM, a paired test per suite; promote (move `champion`) "
                "only on a significant primary gain with no guardrail regression, or hold it as "
                "`challenger` in review mode. Recorded on the MLflow model version.",
    check_specs=[
        dg.AssetCheckSpec(NO_CONTAMINATION, asset="promotion", blocking=True,
                          description="No candidate trained on a private eval item, and the gate ran for "
                                      "every candidate; blocks deployment."),
        dg.AssetCheckSpec(CANDIDATE_PROMOTED, asset="promotion",
                          description="Every candidate passed the gate (promoted, or held for review); a "
                                      "rejection warns with its reasons and the champion stays."),
    ],
)
def promotion(context: dg.AssetExecutionContext, config: PromotionRunConfig, tracerl: TracerlResource):
    cfg = tracerl.load()
    candidates = run_candidates(context)
    if candidates is None:
        context.log.info("no candidate_adapter materialization in this run: nothing to gate")
        yield from _nothing_gated("no candidate in this run")
        return
    wanted = set(config.pairs())
    if wanted:
        skipped = [c for c in candidates if (c["tenant"], c["task"]) not in wanted]
        for c in skipped:
            context.log.info(f"{c['tenant']}/{c['task']} v{c.get('registry_version')}: not in targets, not gated")
        candidates = [c for c in candidates if (c["tenant"], c["task"]) in wanted]
    if not candidates:
        yield from _nothing_gated(f"no candidate of this run is in targets {config.targets}")
        return

    decisions = []
    for c in candidates:  # one at a time, so a gate error on one still gates the others
        try:
            (d,) = gate_candidates(cfg, [c])
        except Exception as e:  # noqa: BLE001 - reported by the blocking check, with the error
            d = {"tenant": c["tenant"], "task": c["task"], "registry_version": str(c.get("registry_version")),
                 "outcome": "error", "passed": False, "reasons": [f"gate error: {type(e).__name__}: {e}"]}
        (context.log.info if d["passed"] else context.log.error)(_line(d))
        decisions.append(d)

    outcomes = [d["outcome"] for d in decisions]
    pairs = sorted({(d["tenant"], d["task"]) for d in decisions})
    evals = {f"{d['tenant']}/{d['task']} v{d['registry_version']}": eval_summary(d) for d in decisions}
    eval_deltas = {name: {suite: f.get("delta") for suite, f in suites.items()}
                   for name, suites in evals.items() if suites}
    blocked = [d for d in decisions if d["outcome"] in ("contaminated", "error")]
    not_promoted = [d for d in decisions if d["outcome"] not in PASSED]
    metadata = {
        "candidates": len(decisions),
        "promoted": outcomes.count("promote"),
        "held_for_review": outcomes.count("hold"),
        "rejected": sum(o in ("reject", "contaminated") for o in outcomes),
        "contaminated": outcomes.count("contaminated"),
        "gate_errors": outcomes.count("error"),
        "decisions": dg.MetadataValue.json(decisions),
        "eval_deltas": dg.MetadataValue.json(eval_deltas),
        "champions": dg.MetadataValue.json(champions(cfg, pairs)),
    }
    for d in decisions:  # one number per tenant/task and suite, so the UI plots it across runs
        for suite, f in eval_summary(d).items():
            if isinstance(f.get("delta"), (int, float)):
                metadata[f"eval_delta.{d['tenant']}/{d['task']}.{suite}"] = float(f["delta"])
    yield dg.MaterializeResult(metadata=metadata, check_results=[
        dg.AssetCheckResult(
            check_name=NO_CONTAMINATION, passed=not blocked, severity=dg.AssetCheckSeverity.ERROR,
            metadata={"contaminated": outcomes.count("contaminated"), "gate_errors": outcomes.count("error"),
                      "blocked": dg.MetadataValue.json([_line(d) for d in blocked])}),
        dg.AssetCheckResult(
            check_name=CANDIDATE_PROMOTED, passed=not not_promoted, severity=dg.AssetCheckSeverity.WARN,
            metadata={"rejected": len(not_promoted),
                      "reasons": dg.MetadataValue.json({f"{d['tenant']}/{d['task']} v{d['registry_version']}":
                                                        d["reasons"] for d in not_promoted}),
                      "promoted": outcomes.count("promote"), "held_for_review": outcomes.count("hold")}),
    ])


gate_assets = [promotion]
