"""The promotion gate as a blocking asset check on `candidate_adapter`.

Deployment assets downstream of `candidate_adapter` run only when this check passes: every
candidate of the run was promoted (or, in review mode, held as `challenger` for a person to
approve with a version tag in the MLflow UI). Rejections and contamination fail it with the
reasons in its metadata.
"""

import dagster as dg

from assets.resources import TracerlResource
from pipelines.gate.config import gate_config
from pipelines.gate.promote import all_pending_approvals, promote_approved
from pipelines.gate.run import gate_candidates


@dg.asset_check(asset="candidate_adapter", blocking=True,
                description="Private eval suites, candidate vs champion on identical items in vLLM, a paired "
                            "test per suite; promote only on a significant primary gain with no guardrail "
                            "regression. Records the decision on the MLflow model version.")
def promotion_gate(context: dg.AssetCheckExecutionContext, tracerl: TracerlResource) -> dg.AssetCheckResult:
    cfg = tracerl.load()
    event = context.instance.get_latest_materialization_event(dg.AssetKey("candidate_adapter"))
    if event is None or event.run_id != context.run.run_id:
        return dg.AssetCheckResult(passed=True, metadata={"candidates": 0, "note": "no candidate in this run"})
    meta = event.asset_materialization.metadata
    candidates = meta["candidates"].value if "candidates" in meta else []
    results = gate_candidates(cfg, candidates)
    for r in results:
        log = context.log.info if r["passed"] else context.log.error
        log(f"{r['tenant']}/{r['task']} v{r['registry_version']}: {r['outcome']}: {'; '.join(r['reasons'])}")
    return dg.AssetCheckResult(
        passed=all(r["passed"] for r in results),
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"candidates": len(results),
                  "promoted": sum(r["outcome"] == "promote" for r in results),
                  "held_for_review": sum(r["outcome"] == "hold" for r in results),
                  "rejected": sum(r["outcome"] in ("reject", "contaminated") for r in results),
                  "decisions": dg.MetadataValue.json(results)})


@dg.op(description="Promote held versions a person approved (tag on the version in the MLflow UI).")
def promote_approved_versions(context: dg.OpExecutionContext, tracerl: TracerlResource) -> None:
    cfg = tracerl.load()
    tag = gate_config(cfg).approval_tag
    for tenant, task in sorted({(t, k) for t, k, _ in all_pending_approvals(cfg, tag)}):
        for done in promote_approved(cfg, tenant, task, tag):  # deploy: see docs/gate.md
            context.log.info(f"{tenant}/{task}: version {done['champion']} is champion (was {done['previous']})")


@dg.job(description="Move `champion` to approved challengers.")
def approval_job():
    promote_approved_versions()


@dg.sensor(job=approval_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
def approved_challengers(context: dg.SensorEvaluationContext, tracerl: TracerlResource):
    """Request a promotion run when someone approved a held version in the MLflow UI."""
    cfg = tracerl.load()
    pending = all_pending_approvals(cfg, gate_config(cfg).approval_tag)
    if not pending:
        return dg.SkipReason("no approved challenger waiting")
    return dg.RunRequest(run_key=",".join(f"{t}.{k}:{v}" for t, k, v in pending))


gate_checks = [promotion_gate]
gate_jobs = [approval_job]
gate_sensors = [approved_challengers]
