"""Review mode: a person approves a held challenger, and it becomes champion.

With `gate.review = true` the gate marks a passing candidate `challenger` (status
awaiting_approval) instead of promoting it. `approved_challengers` watches for the approval tag a
reviewer sets on the version in the MLflow UI and requests `approval_job`, which promotes it.
"""

import dagster as dg

from assets.resources import TracerlResource
from pipelines.gate.config import gate_config
from pipelines.gate.promote import all_pending_approvals, promote_approved


@dg.op(description="Promote held versions a person approved (tag on the version in the MLflow UI).")
def promote_approved_versions(context: dg.OpExecutionContext, tracerl: TracerlResource) -> None:
    cfg = tracerl.load()
    tag = gate_config(cfg).approval_tag
    for tenant, task in sorted({(t, k) for t, k, _ in all_pending_approvals(cfg, tag)}):
        for done in promote_approved(cfg, tenant, task, tag):  # served by the next `deployment` run
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


review_jobs = [approval_job]
review_sensors = [approved_challengers]
