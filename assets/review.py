"""Review mode: a person approves a held challenger, and it becomes champion.

With `gate.review = true` the gate marks a passing candidate `challenger` (status
awaiting_approval) instead of promoting it. `approved_challengers` watches for the approval tag a
reviewer sets on the version in the MLflow UI and requests `approval_job`, which approves it
the way `tracerl approve` does (pipelines/deploy/operations.py): champion, then reconcile.
"""

import dagster as dg

from assets.resources import GatewayResource, MlflowResource


@dg.op(description="Approve held versions a reviewer tagged in the MLflow UI, and serve the new champions.")
def promote_approved_versions(context: dg.OpExecutionContext, mlflow: MlflowResource,
                              gateway: GatewayResource) -> None:
    for result in gateway.approve_tagged():  # same path as `tracerl approve`: registry, then reconcile
        for move in result.registry["approved"]:
            link = mlflow.model_version_url(result.tenant, result.task, move["champion"]).value
            context.log.info(f"{result.tenant}/{result.task}: v{move['adapter_version']} is champion "
                             f"({move['reason']}; was registry version {move['previous']}): {link}")
        (context.log.info if result.ok else context.log.error)(result.summary())


@dg.job(description="Move `champion` to approved challengers.")
def approval_job():
    promote_approved_versions()


@dg.sensor(job=approval_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Every minute: a held challenger a reviewer approved (its approval tag in the MLflow UI) "
                       "requests approval_job, which promotes it and reconciles the gateway.")
def approved_challengers(context: dg.SensorEvaluationContext, mlflow: MlflowResource):
    """Request a promotion run when someone approved a held version in the MLflow UI."""
    pending = mlflow.pending_approvals()
    if not pending:
        return dg.SkipReason("no approved challenger waiting")
    return dg.RunRequest(run_key=",".join(f"{t}.{k}:{v}" for t, k, v in pending))


review_jobs = [approval_job]
review_sensors = [approved_challengers]
