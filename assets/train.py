"""Learner asset: a candidate adapter per tenant/task, from settled rewarded turns.

The sensor asks for a run only when some tenant/task has at least
`learner.min_new_turns` new settled turns, so quiet periods leave no empty runs;
the asset itself skips any tenant/task below that count.
"""

import dagster as dg

from assets.resources import TracerlResource
from pipelines.train.run import count_new_turns, run_learner, training_targets


class LearnerRunConfig(dg.Config):
    targets: list[str] = []  # "tenant/task"; empty: every tenant/task with settled turns


@dg.asset(
    key="candidate_adapter",
    deps=["turn_rewards"],
    group_name="train",
    kinds={"pytorch", "mlflow"},
    output_required=False,
    description="A new LoRA adapter version per tenant/task, trained from the champion on settled "
                "rewarded turns; logged to MLflow and registered as a candidate model version.",
)
def candidate_adapter(context: dg.AssetExecutionContext, config: LearnerRunConfig, tracerl: TracerlResource):
    cfg = tracerl.load()
    targets = [tuple(t.split("/", 1)) for t in config.targets] or training_targets(cfg)
    trained = []
    for tenant, task in targets:
        r = run_learner(cfg, tenant, task)
        context.log.info(f"{tenant}/{task}: {r.status} {r.reason}")
        if r.status == "trained":
            trained.append({"tenant": tenant, "task": task, "adapter_version": r.adapter_version,
                            "parent_version": r.parent_version, "registry_version": r.registry_version,
                            "turns": r.new_turns, "mlflow_run_id": r.mlflow_run_id,
                            "loss": r.metrics.get("loss"), "kl": r.metrics.get("kl")})
    if trained:
        yield dg.MaterializeResult(metadata={
            "candidates": dg.MetadataValue.json(trained),
            "turns_trained": sum(t["turns"] for t in trained),
        })


learner_job = dg.define_asset_job("learner_job", selection=[candidate_adapter])


@dg.sensor(job=learner_job, minimum_interval_seconds=300, default_status=dg.DefaultSensorStatus.RUNNING)
def enough_new_turns(context: dg.SensorEvaluationContext, tracerl: TracerlResource):
    """Request a learner run when a tenant/task has enough new settled turns."""
    cfg = tracerl.load()
    ready = [f"{tenant}/{task}" for tenant, task in training_targets(cfg)
             if count_new_turns(cfg, tenant, task) >= cfg.learner.min_new_turns]
    if not ready:
        return dg.SkipReason(f"no tenant/task has {cfg.learner.min_new_turns} new settled turns")
    return dg.RunRequest(run_key=None, run_config=dg.RunConfig(
        ops={"candidate_adapter": LearnerRunConfig(targets=ready)}))


train_assets = [candidate_adapter]
train_jobs = [learner_job]
train_sensors = [enough_new_turns]
