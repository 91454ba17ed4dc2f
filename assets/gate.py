"""The promotion gate as an asset, `promotion`: the decision on this run's candidate for its target.

The candidate is the one this run's `candidate_adapter` registered for the same partition. The
gate runs the target's private eval suites (candidate vs champion on identical items in vLLM, a
paired test per suite), records the decision on the MLflow model version and moves the registry
aliases; it never swaps what serves: `deployment` reconciles the gateway to the `champion` alias.

A rejection is an outcome, not a failure: `promotion` materializes with `outcome = reject` and its
reasons, the run is tagged `tracerl/outcome=reject`, and `deployment` runs and finds the champion
unchanged. Only `no_contamination` (blocking) stops the loop: a candidate trained on a private
eval item, or a gate that could not run, fails the run before `deployment`.

No candidate in this run (the learner skipped): nothing materializes and the check passes with
`candidates = 0`; `deployment` is skipped in that run.

The gate is in the `gate` concurrency pool (assets/pools.py, limit 1): one gate's evals at a time
across every run; the gates of several targets take turns instead of sharing the cores with each
other and the learners.
"""

import dagster as dg

from assets.pools import GATE_POOL
from assets.resources import LakeResource, MlflowResource
from assets.targets import OUTCOME_TAG, parse_target, tag_run, targets
from pipelines.config import TracerlConfig
from pipelines.gate.run import gate_candidates

NO_CONTAMINATION = "no_contamination"
BLOCKING = ("contaminated", "error")  # every other outcome (promote, canary, hold, reject) lets deployment run


def run_candidate(context: dg.AssetExecutionContext) -> dict | None:
    """The metadata of this run's `candidate_adapter` materialization for this partition, or None."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("candidate_adapter"), asset_partitions=[context.partition_key]),
        limit=1).records
    if not records or records[0].run_id != context.run.run_id:
        return None
    return {k: v.value for k, v in records[0].asset_materialization.metadata.items()}


def gate_one(cfg: TracerlConfig, tenant: str, task: str, registry_version: str) -> dict:
    """The gate's summary for one candidate; an exception becomes outcome "error" (blocking)."""
    try:
        (d,) = gate_candidates(cfg, [{"tenant": tenant, "task": task, "registry_version": registry_version}])
    except Exception as e:  # noqa: BLE001 - reported by the blocking check, with the error
        d = {"tenant": tenant, "task": task, "registry_version": registry_version, "outcome": "error",
             "passed": False, "reasons": [f"gate error: {type(e).__name__}: {e}"]}
    return d


def sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits (what metadata shows: 0.6667, not 0.6666666666666666)."""
    return float(f"{x:.{digits}g}")


def rounded(value):
    """Floats in ``value`` (nested dicts and lists too) to 4 significant digits; NaN and infinities as None."""
    import math

    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        return sig(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def eval_metadata(decision: dict) -> dict[str, dg.MetadataValue]:
    """One number per suite and side, `eval.<suite>.candidate|champion|delta` (the UI plots each
    across the partition's runs), and `primary_suite`: which of them decided (`primary_eval`)."""
    out: dict[str, dg.MetadataValue] = {}
    suites = decision.get("suites") or {}
    for suite, f in suites.items():
        for side in ("candidate", "champion", "delta"):
            if isinstance(f.get(side), (int, float)):
                out[f"eval.{suite}.{side}"] = dg.MetadataValue.float(sig(float(f[side])))
    primary = next((name for name, f in suites.items() if f.get("role") == "primary"), None)
    if primary is not None:
        out["primary_suite"] = dg.MetadataValue.text(primary)
    return out


def primary_eval(metadata: dict) -> tuple[float | None, float | None]:
    """(candidate, champion) score of the primary suite from `promotion`'s metadata values."""
    suite = metadata.get("primary_suite")
    if not suite:
        return None, None
    return metadata.get(f"eval.{suite}.candidate"), metadata.get(f"eval.{suite}.champion")


@dg.asset(
    key="promotion",
    deps=["candidate_adapter"],
    partitions_def=targets,
    group_name="gate",
    kinds={"mlflow", "vllm"},
    output_required=False,
    pool=GATE_POOL,
    description="The gate's decision on this run's candidate: private eval suites, candidate vs champion on "
                "identical items in vLLM, a paired test per suite; promote (move `champion`) only on a "
                "significant primary gain with no guardrail regression, hold it as `challenger` in review "
                "mode, else reject (an outcome, not a failure). Recorded on the MLflow model version.",
    check_specs=[
        dg.AssetCheckSpec(NO_CONTAMINATION, asset="promotion", blocking=True,
                          description="The candidate trained on no private eval item and the gate ran; "
                                      "blocks deployment. A rejection passes this check."),
    ],
)
def promotion(context: dg.AssetExecutionContext, lake: LakeResource, mlflow: MlflowResource):
    tenant, task = parse_target(context.partition_key)
    candidate = run_candidate(context)
    if candidate is None:
        context.log.info(f"{tenant}/{task}: no candidate_adapter materialization in this run: nothing to gate")
        yield dg.AssetCheckResult(asset_key="promotion", check_name=NO_CONTAMINATION, passed=True,
                                  metadata={"candidates": 0, "note": "no candidate in this run"})
        return
    rv = str(candidate["registry_version"])
    d = gate_one(lake.settings(), tenant, task, rv)  # the lake's trained-turns ledger (contamination), the
                                                     # registry's champion; the decision goes to MLflow
    # a pass with canary.enabled enters the canary: its outcome says so (champion did not move)
    outcome, reasons = "canary" if d.get("canary") else d["outcome"], list(d.get("reasons") or [])
    line = f"{tenant}/{task} v{candidate['adapter_version']} (registry {rv}): {outcome}: {'; '.join(reasons)}"
    (context.log.error if outcome in BLOCKING else context.log.info)(line)
    tag_run(context, {OUTCOME_TAG: outcome})
    champion = mlflow.champion(tenant, task)  # after the gate moved the aliases
    metadata = {
        "outcome": outcome,
        "reasons": dg.MetadataValue.json(reasons),
        "candidate_adapter_version": int(candidate["adapter_version"]),
        "candidate_registry_version": rv,
        "model_version": mlflow.model_version_url(tenant, task, rv),
        "promoted": outcome == "promote",
        "canary": bool(d.get("canary")),  # passed, and entered the canary (canary.enabled) instead
        "offpolicy": dg.MetadataValue.json(rounded(d.get("offpolicy") or {})),
        "champion_adapter_version": champion["adapter_version"] if champion else dg.MetadataValue.null(),
        "champion_registry_version": champion["registry_version"] if champion else "",
        "suites": dg.MetadataValue.json(rounded(d.get("suites") or {})),
        "signatures": dg.MetadataValue.json(rounded(d.get("signatures") or {})),
        "baseline": str(d.get("baseline") or ""),
        "eval_items": d.get("items") or 0,
        "gate_seconds": sig(float(d.get("seconds") or 0.0)),
        # what the learner's learned reward predicted beside what the private evals measured (#41)
        **{k: dg.MetadataValue.float(sig(float(d[k]))) if isinstance(d.get(k), (int, float)) else dg.MetadataValue.null()
           for k in ("predicted_gain", "measured_gain")},
        **eval_metadata(d),
    }
    if d.get("mlflow_run_id"):
        metadata["gate_run"] = mlflow.run_url(d["mlflow_run_id"])
    yield dg.MaterializeResult(metadata=metadata, check_results=[dg.AssetCheckResult(
        check_name=NO_CONTAMINATION, passed=outcome not in BLOCKING, severity=dg.AssetCheckSeverity.ERROR,
        metadata={"outcome": outcome, "reasons": dg.MetadataValue.json(reasons)})])


gate_assets = [promotion]
