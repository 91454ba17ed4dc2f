"""The canary asset: a challenger on a share of live traffic, decided by live rewards (issue #15).

Partitioned by target like the loop. A materialization is one step of the target's running canary
(pipelines/canary/run.py): its settled sessions per arm from the lake, the always-valid decision,
and its action (promote, roll back, expire, or keep going), recorded in MLflow. The
`canary_settling` sensor requests a step whenever a reward run settled more turns while a canary
runs (run key: the canary and the reward watermark), so a canary is checked after every batch of
rewards, which its confidence sequences allow.

Checks: `guardrails_hold` fails (ERROR) when the step rolled the challenger back on a guardrail or
the reward; `step_applied` fails when the decided action could not be carried out (the gateway
down, a refused swap: the canary keeps running and the next step retries).
"""


import dagster as dg

from assets.resources import GatewayResource, LakeResource, MlflowResource
from assets.targets import TARGETS, parse_target, target_key, targets
from pipelines.canary.run import advance, live_canaries

GUARDRAILS_HOLD, STEP_APPLIED = "guardrails_hold", "step_applied"


@dg.asset(key="canary", deps=["deployment"], partitions_def=targets, group_name="deploy", kinds={"mlflow"},
          description="The target's running canary, one step: settled sessions per arm, the always-valid "
                      "decision (promote | rollback | expire | continue) with its reasons, and its action.",
          check_specs=[dg.AssetCheckSpec(GUARDRAILS_HOLD, asset="canary",
                                         description="The challenger is not worse than the champion on the "
                                                     "reward or any guardrail (else it was rolled back)."),
                       dg.AssetCheckSpec(STEP_APPLIED, asset="canary",
                                         description="The decided action was carried out.")])
def canary(context: dg.AssetExecutionContext, lake: LakeResource, mlflow: MlflowResource,
           gateway: GatewayResource):
    tenant, task = parse_target(context.partition_key)
    step = advance(lake.settings(), tenant, task)  # a promotion or a stop goes through the gateway
    (context.log.error if step.action == "failed" else context.log.info)(step.line())
    d = step.decision
    metadata: dict = {"action": step.action, "summary": step.line(), "gateway": gateway.health()}
    if d is not None:
        metadata.update({"champion": f"v{step.champion}", "challenger": f"v{step.challenger}",
                         "sessions_champion": d.sessions[0], "sessions_challenger": d.sessions[1],
                         "decision": dg.MetadataValue.json(d.to_dict())})
        if d.reward is not None:
            metadata.update(gain=d.reward.estimate, gain_low=d.reward.low, gain_high=d.reward.high)
    if step.detail.get("run_id"):
        metadata["mlflow_run"] = mlflow.run_url(step.detail["run_id"])
    yield dg.MaterializeResult(metadata=metadata, check_results=[
        dg.AssetCheckResult(check_name=GUARDRAILS_HOLD, passed=step.action != "rolled_back",
                            severity=dg.AssetCheckSeverity.ERROR,
                            metadata={"reasons": dg.MetadataValue.json(d.reasons if d else [])}),
        dg.AssetCheckResult(check_name=STEP_APPLIED, passed=step.action != "failed",
                            metadata={"error": step.detail.get("error", "")})])


canary_job = dg.define_asset_job("canary_job", selection=[canary], description="One step of a target's running canary.")


@dg.sensor(job=canary_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Every minute: for each target running a canary, a canary step once a reward run "
                       "has settled more turns since its last step.")
def canary_settling(context: dg.SensorEvaluationContext, lake: LakeResource):
    from pipelines.lake.reward_tables import reward_state

    cfg = lake.settings()
    running = live_canaries(cfg)
    if not running:
        return dg.SkipReason("no canary running")
    seq = reward_state(cfg.table_store).seq  # the last reward run's commit: a step once another committed
    known = set(context.instance.get_dynamic_partitions(TARGETS))
    keys = [target_key(r.tenant, r.task) for r in running]
    return dg.SensorResult(
        run_requests=[dg.RunRequest(partition_key=k, run_key=f"{k}:{r.canary.id}:{seq}")
                      for k, r in zip(keys, running)],
        dynamic_partitions_requests=[targets.build_add_request(sorted(set(keys) - known))] if set(keys) - known
        else [])


canary_assets = [canary]
canary_jobs = [canary_job]
canary_sensors = [canary_settling]
