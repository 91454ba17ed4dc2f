"""Review mode: a person approves a held challenger, and it becomes champion.

With `gate.review = true` the gate marks a passing candidate `challenger` (status
awaiting_approval) instead of promoting it. `approved_challengers` watches for the approval tag a
reviewer sets on the version in the MLflow UI and requests `approval_job`, which approves it
the way `tracerl approve` does (pipelines/deploy/operations.py): champion, then reconcile.
"""

import dagster as dg

from assets.resources import TracerlResource
from pipelines.deploy.operations import approve_tagged
from pipelines.config import gate_config
from pipelines.adapters.promote import all_pending_approvals


@dg.op(description="Approve held versions a reviewer tagged in the MLflow UI, and serve the new champions.")
def promote_approved_versions(context: dg.OpExecutionContext, tracerl: TracerlResource) -> None:
    cfg = tracerl.load()
    for result in approve_tagged(cfg, gate_config(cfg).approval_tag):  # same path as `tracerl approve`
        for move in result.registry["approved"]:
            context.log.info(f"{result.tenant}/{result.task}: v{move['adapter_version']} is champion "
                             f"({move['reason']}; was registry version {move['previous']})")
        (context.log.info if result.ok else context.log.error)(result.summary())


@dg.job(description="Move `champion` to approved challengers.")
def approval_job():
    promote_approved_versions()


@dg.sensor(job=approval_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Every minute: a held challenger a reviewer approved (its approval tag in the MLflow UI) "
                       "requests approval_job, which promotes it and reconciles the gateway.")
def approved_challengers(context: dg.SensorEvaluationContext, tracerl: TracerlResource):
    """Request a promotion run when someone approved a held version in the MLflow UI."""
    cfg = tracerl.load()
    pending = all_pending_approvals(cfg, gate_config(cfg).approval_tag)
    if not pending:
        return dg.SkipReason("no approved challenger waiting")
    return dg.RunRequest(run_key=",".join(f"{t}.{k}:{v}" for t, k, v in pending))


review_jobs = [approval_job]
review_sensors = [approved_challengers]
