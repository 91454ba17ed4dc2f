"""Learner asset and the closed loop: candidate adapter -> promotion gate -> deployment.

The `enough_new_turns` sensor requests a `closed_loop_job` run only when some tenant/task has at
least `learner.min_new_turns` new settled turns, naming those tenant/tasks as the run's targets,
so quiet periods leave no empty runs; the learner asset itself skips any tenant/task below that
count. The hourly `closed_loop_hourly` schedule is the backstop: it asks for the same run when the
sensor has not, and otherwise re-syncs only `deployment` with the registry (the champion also moves
through `approval_job`, and a swap waits while the gateway is down).
"""

import dagster as dg

from assets.resources import TargetsConfig, TracerlResource
from pipelines.train.run import count_new_turns, run_learner, training_targets

LOOP_JOB = "closed_loop_job"
LOOP_ASSETS = ("candidate_adapter", "promotion", "deployment")
_ACTIVE = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
           dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


class LearnerRunConfig(TargetsConfig):
    """targets: "tenant/task"; empty: every tenant/task with settled turns."""


@dg.asset(
    key="candidate_adapter",
    deps=["turn_rewards"],
    group_name="train",
    kinds={"pytorch", "mlflow"},
    output_required=False,
    description="A new LoRA adapter version per tenant/task, trained on new settled rewarded turns plus "
                "replayed earlier ones, continuing the training branch (its last candidate, or the champion "
                "after a promotion or a reset); logged to MLflow and registered as a candidate model version.",
)
def candidate_adapter(context: dg.AssetExecutionContext, config: LearnerRunConfig, tracerl: TracerlResource):
    cfg = tracerl.load()
    targets = config.pairs() or training_targets(cfg)
    trained = []
    for tenant, task in targets:
        r = run_learner(cfg, tenant, task)
        context.log.info(f"{tenant}/{task}: {r.status} {r.reason}")
        if r.status == "trained":
            trained.append({"tenant": tenant, "task": task, "adapter_version": r.adapter_version,
                            "parent_version": r.parent_version, "registry_version": r.registry_version,
                            "turns": r.new_turns, "replayed_turns": r.replayed_turns,
                            "branch_base": r.branch_base, "branch_depth": r.branch_depth,
                            "reset_reason": r.reset_reason, "mlflow_run_id": r.mlflow_run_id,
                            "loss": r.metrics.get("loss"), "kl": r.metrics.get("kl")})
    if trained:
        yield dg.MaterializeResult(metadata={
            "candidates": dg.MetadataValue.json(trained),
            "turns_trained": sum(t["turns"] for t in trained),
        })


# The whole loop in one run: the gate's checks on `promotion` come with the selection.
closed_loop_job = dg.define_asset_job(
    LOOP_JOB, selection=dg.AssetSelection.assets(*LOOP_ASSETS),
    description="Train candidates, gate them (promotion + its checks), hot-swap the champions.")


def ready_targets(cfg) -> list[str]:
    """tenant/tasks with at least learner.min_new_turns new settled turns."""
    return [f"{tenant}/{task}" for tenant, task in training_targets(cfg)
            if count_new_turns(cfg, tenant, task) >= cfg.learner.min_new_turns]


def loop_run_config(targets: list[str]) -> dg.RunConfig:
    """The same targets for the learner, the gate and the deployment."""
    return dg.RunConfig(ops={name: TargetsConfig(targets=targets) for name in LOOP_ASSETS})


def _loop_running(instance: dg.DagsterInstance) -> dg.DagsterRun | None:
    """A closed-loop run queued or in progress: the learner has no lock of its own, so a second
    run at the same time would train the same turns twice."""
    runs = instance.get_runs(dg.RunsFilter(job_name=LOOP_JOB, statuses=_ACTIVE), limit=1)
    return runs[0] if runs else None


@dg.sensor(job=closed_loop_job, minimum_interval_seconds=300, default_status=dg.DefaultSensorStatus.RUNNING)
def enough_new_turns(context: dg.SensorEvaluationContext, tracerl: TracerlResource):
    """Request a closed-loop run for the tenant/tasks that have enough new settled turns."""
    cfg = tracerl.load()
    ready = ready_targets(cfg)
    if not ready:
        return dg.SkipReason(f"no tenant/task has {cfg.learner.min_new_turns} new settled turns")
    running = _loop_running(context.instance)
    if running is not None:
        return dg.SkipReason(f"{', '.join(ready)} ready, but {LOOP_JOB} run {running.run_id} is still going")
    return dg.RunRequest(run_key=None, run_config=loop_run_config(ready), tags={"tracerl/targets": ",".join(ready)})


@dg.schedule(job=closed_loop_job, cron_schedule="17 * * * *", default_status=dg.DefaultScheduleStatus.RUNNING)
def closed_loop_hourly(context: dg.ScheduleEvaluationContext, tracerl: TracerlResource):
    """Backstop for the sensor: the whole loop if any tenant/task is ready, else only `deployment`
    (serve each registry champion: approvals, and swaps that waited for the gateway)."""
    running = _loop_running(context.instance)
    if running is not None:
        return dg.SkipReason(f"{LOOP_JOB} run {running.run_id} is still going")
    ready = ready_targets(tracerl.load())
    if ready:
        return dg.RunRequest(run_config=loop_run_config(ready), tags={"tracerl/targets": ",".join(ready)})
    return dg.RunRequest(asset_selection=[dg.AssetKey("deployment")], tags={"tracerl/targets": "all"})


train_assets = [candidate_adapter]
train_jobs = [closed_loop_job]
train_sensors = [enough_new_turns]
train_schedules = [closed_loop_hourly]
