"""The learner asset: one candidate adapter per loop run, for the run's target (its partition).

Not enough new settled turns (`learner.min_new_turns`): nothing materializes, the run is tagged
`tracerl/outcome=no_candidate` with the reason in the log, and `promotion`/`deployment` are
skipped in that run. The job, sensor and schedule that run it are in assets/loop.py.
"""

import dagster as dg

from assets.links import model_version_url, run_url
from assets.resources import TracerlResource
from assets.targets import CANDIDATE_TAG, OUTCOME_TAG, REASON_TAG, parse_target, tag_run, targets
from pipelines.train.run import run_learner

NO_CANDIDATE = "no_candidate"
_NUMERIC = ("loss", "kl", "reward_mean", "clip_frac", "tokens_per_s")  # plotted per partition in the UI


@dg.asset(
    key="candidate_adapter",
    deps=["turn_rewards"],
    partitions_def=targets,
    group_name="train",
    kinds={"pytorch", "mlflow"},
    output_required=False,
    description="A new LoRA adapter version for the tenant/task, trained on its new settled rewarded turns "
                "plus replayed earlier ones, continuing the training branch (its last candidate, or the "
                "champion after a promotion or a reset); logged to MLflow and registered as a candidate "
                "model version. Skipped (no materialization) below learner.min_new_turns new turns.",
)
def candidate_adapter(context: dg.AssetExecutionContext, tracerl: TracerlResource):
    cfg = tracerl.load()
    tenant, task = parse_target(context.partition_key)
    r = run_learner(cfg, tenant, task)
    if r.status != "trained":
        context.log.info(f"{tenant}/{task}: no candidate: {r.reason}")
        tag_run(context, {OUTCOME_TAG: NO_CANDIDATE, REASON_TAG: r.reason})
        return
    context.log.info(f"{tenant}/{task}: v{r.adapter_version} from "
                     f"{'v' + str(r.parent_version) if r.parent_version else 'the base model'} on {r.new_turns} "
                     f"new + {r.replayed_turns} replayed turns (registry version {r.registry_version})")
    tag_run(context, {CANDIDATE_TAG: f"v{r.adapter_version}"})
    metadata = {
        "adapter_version": r.adapter_version,
        "parent_version": r.parent_version if r.parent_version is not None else dg.MetadataValue.null(),
        "registry_version": str(r.registry_version),
        "model_version": model_version_url(cfg, tenant, task, r.registry_version),
        "mlflow_run": run_url(cfg, r.mlflow_run_id),
        "mlflow_run_id": r.mlflow_run_id,
        "turns": r.new_turns,
        "replayed_turns": r.replayed_turns,
        "excluded_eval_turns": r.excluded_eval_turns,
        "branch_base": r.branch_base if r.branch_base is not None else dg.MetadataValue.null(),
        "branch_depth": r.branch_depth,
        "reset_reason": r.reset_reason or "",
    }
    for k in _NUMERIC:
        if isinstance(r.metrics.get(k), (int, float)):
            metadata[k] = dg.MetadataValue.float(float(r.metrics[k]))
    yield dg.MaterializeResult(metadata=metadata)


train_assets = [candidate_adapter]
