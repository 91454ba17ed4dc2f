"""The learner asset: one candidate adapter per loop run, for the run's target (its partition).

Not enough new settled turns (`learner.min_new_turns`): nothing materializes, the run is tagged
`tracerl/outcome=no_candidate` with the reason in the log, and `promotion`/`deployment` are
skipped in that run. The job, sensor and schedule that run it are in assets/loop.py.

Learners for different targets run side by side, each in its own run (a process under
`dagster dev`, a pod under the K8sRunLauncher): the asset is in the `learner` concurrency pool
(assets/pools.py; limit 2, set on the instance), which caps how many train at once across every
run, the loop's and `learner_job`'s alike. A learner waiting for a slot holds up only its own run:
ingest, rewards and the gate are other pools, and the run queue is not the limit (learner runs
carry the `tracerl/lane` tag the queue caps below its total). `learner_job` trains one target; a
backfill over targets trains many.
"""

import dagster as dg

from assets.pools import LANE_TAG, LEARNER_LANE, LEARNER_POOL
from assets.resources import LakeResource, MlflowResource
from assets.gate import rounded, sig
from assets.targets import CANDIDATE_TAG, OUTCOME_TAG, REASON_TAG, parse_target, tag_run, targets
from pipelines.adapters.version import label
from pipelines.train.run import run_learner

NO_CANDIDATE = "no_candidate"
# the learner's last-step metrics, plotted per partition in the UI (reward_mean: that step's batch)
_NUMERIC = ("loss", "kl", "reward_mean", "clip_frac", "tokens_per_s")


def new_turns_reward(lake: LakeResource, tenant: str, task: str, version: int) -> float | None:
    """Mean settled reward of the new turns adapter `version` trained on (its data window): the
    iteration's live reward as the reward spec scores it, one point per run in the UI's plot."""
    import pyarrow as pa

    from pipelines.adapters.store import AdapterStore

    store = AdapterStore(lake.settings().adapter_root)
    ids = store.get(tenant, task, version).meta.get("data_window", {}).get("turn_ids") or []
    if not ids:
        return None
    con = lake.connect()
    con.register("_new_turns", pa.table({"turn_id": ids}))
    (mean,) = con.execute("""
        SELECT avg(total) FROM (
            SELECT total FROM rewards WHERE settled AND labelled AND tenant = ?
              AND turn_id IN (SELECT turn_id FROM _new_turns)
            QUALIFY row_number() OVER (PARTITION BY turn_id ORDER BY reward_seq DESC) = 1)""", [tenant]).fetchone()
    return None if mean is None else float(mean)


@dg.asset(
    key="candidate_adapter",
    deps=["turn_rewards"],
    partitions_def=targets,
    group_name="train",
    kinds={"pytorch", "mlflow"},
    output_required=False,
    pool=LEARNER_POOL,
    description="A new LoRA adapter version for the tenant/task, trained on its new settled rewarded turns "
                "plus replayed earlier ones, continuing the training branch (its last candidate, or the "
                "champion after a promotion or a reset); logged to MLflow and registered as a candidate "
                "model version. Skipped (no materialization) below learner.min_new_turns new turns.",
)
def candidate_adapter(context: dg.AssetExecutionContext, lake: LakeResource, mlflow: MlflowResource):
    tenant, task = parse_target(context.partition_key)
    r = run_learner(lake.settings(), tenant, task)  # reads the lake, logs and registers in MLflow
    if r.status != "trained":
        context.log.info(f"{tenant}/{task}: no candidate: {r.reason}")
        tag_run(context, {OUTCOME_TAG: NO_CANDIDATE, REASON_TAG: r.reason})
        return
    trained, dropped = r.metrics.get("trained_turns"), r.metrics.get("dropped_turns", 0)
    counted = "" if trained is None else f" ({trained} trained, {dropped} dropped)"
    context.log.info(f"{tenant}/{task}: v{r.adapter_version} from "
                     f"{'v' + str(r.parent_version) if r.parent_version else 'the base model'} on {r.new_turns} "
                     f"new + {r.replayed_turns} replayed turns{counted} (registry version {r.registry_version})")
    tag_run(context, {CANDIDATE_TAG: label(r.adapter_version)})
    metadata = {
        "adapter_version": r.adapter_version,
        "parent_version": r.parent_version if r.parent_version is not None else dg.MetadataValue.null(),
        "registry_version": str(r.registry_version),
        "model_version": mlflow.model_version_url(tenant, task, r.registry_version),
        "mlflow_run": mlflow.run_url(r.mlflow_run_id),  # the run id is in the link
        # turns + replayed_turns = trained_turns + dropped_turns (why: the version's description)
        "turns": r.new_turns,
        "replayed_turns": r.replayed_turns,
        **({} if trained is None else {"trained_turns": trained, "dropped_turns": dropped}),
        "excluded_eval_turns": r.excluded_eval_turns,
        "branch_base": r.branch_base if r.branch_base is not None else dg.MetadataValue.null(),
        "branch_depth": r.branch_depth,
        "reset_reason": r.reset_reason or "",
        # the new turns by where their label came from ("model": the reward model's, learner.reward_model)
        "labelled_turns": r.metrics.get("labelled_turns", r.new_turns),
        "turns_by_source": dg.MetadataValue.json({k.removeprefix("turns."): v for k, v in r.metrics.items()
                                                  if k.startswith("turns.")}),
        "coverage": dg.MetadataValue.float(sig(float(r.metrics.get("coverage", 0.0)))),  # of the new settled turns
    }
    for signal in ("reward_model", "judge"):  # each learned signal's worth on held-out votes, and its verdict
        if f"{signal}.reason" in r.metrics:
            metadata[signal] = dg.MetadataValue.json(rounded(
                {k.removeprefix(f"{signal}."): v for k, v in r.metrics.items() if k.startswith(f"{signal}.")}))
    reward = new_turns_reward(lake, tenant, task, r.adapter_version)
    if reward is not None:
        metadata["new_turns_reward"] = dg.MetadataValue.float(sig(reward))
    for k in _NUMERIC:
        if isinstance(r.metrics.get(k), (int, float)):
            metadata[k] = dg.MetadataValue.float(sig(float(r.metrics[k])))
    yield dg.MaterializeResult(metadata=metadata)


learner_job = dg.define_asset_job(
    "learner_job", selection=[candidate_adapter],  # partitioned by targets, as its asset
    tags={LANE_TAG: LEARNER_LANE},
    description="Train a candidate adapter for one tenant/task (the partition) on the rewards already "
                "settled, without ingest, the gate or a deployment: a backfill over targets trains them in "
                "parallel, as many at once as the `learner` concurrency pool allows.")

train_assets = [candidate_adapter]
train_jobs = [learner_job]
