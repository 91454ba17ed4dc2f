"""The closed loop as one Dagster job, and what starts it.

`closed_loop_job` is one iteration of the loop for one target (tenant/task, its partition):

    raw_events (observed) -> lake_events -> turn_rewards -> candidate_adapter -> promotion -> deployment

Ingest and rewards are shared by every target (one Kafka topic, one lake), so each run lands what
is new for everyone and settles every turn that can settle; the learner, the gate and the
deployment work on the run's target only. This job is the only driver of the loop: the
`enough_new_turns` sensor, the `closed_loop_hourly` schedule, `tracerl loop`, `make demo` and the
benchmarks (in-process, assets/driver.py) all run it, so every iteration is a run in the UI.

One loop at a time per target: the instance's run queue allows one run per `dagster/partition`
value (dagster_home/dagster.yaml), the sensor and the schedule skip a target with a run queued or
in progress, and the in-process driver refuses to start beside one (the learner has no lock of its
own: two runs at once would train the same turns twice).

Loops for several targets run at once, and the steps limit each other, not the runs: each step
that needs holding is in a concurrency pool (assets/pools.py): `lake_events` in `ingest` and
`turn_rewards` in `rewards` (one at a time: the second loop's finds nothing new, so the shared work
is done once), `candidate_adapter` in `learner` (2), `promotion` in `gate` (1). A loop run carries
`tracerl/lane=learner`, which the run queue caps below its total, so loop runs waiting for the
learner never take the run slots the */5 ingest and reward runs need.
"""

from __future__ import annotations

import dagster as dg

from assets.pools import LANE_TAG, LEARNER_LANE
from assets.resources import LakeResource
from assets.targets import TARGETS, target_key, targets
from pipelines.config import TracerlConfig
from pipelines.train.run import count_new_turns, training_targets

LOOP_JOB = "closed_loop_job"
LOOP_ASSETS = ("raw_events", "lake_events", "turn_rewards", "candidate_adapter", "promotion", "deployment")
NEW_TURNS_TAG = "tracerl/new_turns"  # "40/32": new settled turns / learner.min_new_turns, when requested
ACTIVE = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
          dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]

DEPLOY_LANE = "deploy"  # the hourly deployment-only runs: no learner, not capped with the loops

closed_loop_job = dg.define_asset_job(
    LOOP_JOB, selection=dg.AssetSelection.assets(*LOOP_ASSETS),  # partitioned by targets, as its assets
    tags={LANE_TAG: LEARNER_LANE},  # the run queue caps the runs in this lane (dagster_home/dagster.yaml)
    description="One iteration of the closed loop for one tenant/task (the partition): land new events, "
                "settle rewards, train a candidate adapter, gate it on the private evals, and reconcile the "
                "gateway to the registry champion (a hot swap when the gate promoted). The run's "
                "`tracerl/outcome` tag says what the gate decided.")


def active_run(instance: dg.DagsterInstance, key: str) -> dg.DagsterRun | None:
    """A run for target `key` (any job: the loop, a deployment-only run, a UI launch) queued or going."""
    runs = instance.get_runs(dg.RunsFilter(statuses=ACTIVE, tags={"dagster/partition": key}), limit=1)
    return runs[0] if runs else None


def readiness(cfg: TracerlConfig) -> dict[str, tuple[int, int]]:
    """(new settled turns, the target's learner.min_new_turns) of every tenant/task with settled turns."""
    return {target_key(tenant, task): (count_new_turns(cfg, tenant, task),
                                       cfg.for_target(tenant, task).learner.min_new_turns)
            for tenant, task in training_targets(cfg)}


@dg.sensor(job=closed_loop_job, minimum_interval_seconds=300, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Every 5 minutes: registers each tenant/task with settled turns as a partition, and "
                       "requests a loop run for each one with at least learner.min_new_turns new settled "
                       "turns and no run of its own queued or going. A skipped tick says, per target, how "
                       "many new settled turns it has of the threshold.")
def enough_new_turns(context: dg.SensorEvaluationContext, lake: LakeResource):
    ready = readiness(lake.settings())
    known = set(context.instance.get_dynamic_partitions(TARGETS))
    new = sorted(set(ready) - known)
    requests, waiting = [], []
    for key, (n, need) in sorted(ready.items()):
        status = f"{key}: {n}/{need} new settled turns"
        running = active_run(context.instance, key) if n >= need else None
        if n < need:
            waiting.append(status)
        elif running is not None:
            waiting.append(f"{status}, but run {running.run_id[:8]} is still going")
        else:
            requests.append(dg.RunRequest(partition_key=key, tags={NEW_TURNS_TAG: f"{n}/{need}"}))
    if waiting and requests:
        context.log.info("not requested: " + "; ".join(waiting))
    skip = None if requests else ("; ".join(waiting) or "no tenant/task has settled turns yet")
    return dg.SensorResult(run_requests=requests, skip_reason=skip,
                           dynamic_partitions_requests=[targets.build_add_request(new)] if new else [])


@dg.schedule(job=closed_loop_job, cron_schedule="17 * * * *", default_status=dg.DefaultScheduleStatus.RUNNING,
             description="Hourly backstop for the sensor, per known target: the whole loop when it has enough "
                         "new settled turns, else only `deployment` (reconcile the gateway to the registry "
                         "champion: approvals, operator actions, swaps that waited for the gateway). A target "
                         "with a run queued or going is left alone.")
def closed_loop_hourly(context: dg.ScheduleEvaluationContext, lake: LakeResource):
    ready = readiness(lake.settings())
    requests, busy = [], []
    for key in sorted(context.instance.get_dynamic_partitions(TARGETS)):
        running = active_run(context.instance, key)
        if running is not None:
            busy.append(f"{key}: run {running.run_id[:8]} is still going")
            continue
        n, need = ready.get(key, (0, 0))
        if key in ready and n >= need:
            requests.append(dg.RunRequest(partition_key=key, tags={NEW_TURNS_TAG: f"{n}/{need}"}))
        else:
            requests.append(dg.RunRequest(partition_key=key, asset_selection=[dg.AssetKey("deployment")],
                                          tags={LANE_TAG: DEPLOY_LANE}))
    if not requests:
        return dg.SkipReason("; ".join(busy) or "no target registered yet (the sensor registers them)")
    return requests


loop_jobs = [closed_loop_job]
loop_sensors = [enough_new_turns]
loop_schedules = [closed_loop_hourly]
