"""Reward asset: per-turn rewards from feedback and tool outcomes, incremental over the lake."""


from datetime import datetime, timedelta, timezone

import dagster as dg

from assets.pools import REWARDS_POOL
from assets.resources import LakeResource
from pipelines.reward.checks import BOUNDS, DRIFT, UNLABELLED, CheckLimits, evaluate
from pipelines.reward.engine import run_rewards
from pipelines.reward.spec import load_spec_book, reward_spec_book


class RewardRunConfig(dg.Config):
    spec_path: str | None = None   # this run only: one spec TOML for every tenant; None: the configuration's
                                   # reward.spec, per target (pipelines.reward.spec.reward_spec_book)
    now: str | None = None         # ISO 8601 "now" for settling (event time; naive = UTC); None: wall clock
    max_unlabelled_share: float = CheckLimits.max_unlabelled_share
    drift_warn: float = CheckLimits.drift_warn
    drift_error: float = CheckLimits.drift_error
    votes_share: float = CheckLimits.votes_share  # the votes explain a component's move when they moved the
                                                  # same way by at least this share of it


def settled_means(settled) -> tuple[float | None, dict[str, dict]]:
    """Mean total reward of this run's settled, labelled turns: overall and per tenant/task."""
    if settled is None or settled.num_rows == 0:
        return None, {}
    rows = settled.group_by(["tenant", "task"]).aggregate([("total", "sum"), ("total", "count")]).to_pylist()
    labelled = sum(row["total_count"] for row in rows)
    by_target = {f"{row['tenant']}/{row['task']}": {
        "mean_reward": round(row["total_sum"] / row["total_count"], 6) if row["total_count"] else None,
        "labelled_turns": row["total_count"]} for row in sorted(rows, key=lambda x: (x["tenant"], x["task"]))}
    if not labelled:
        return None, by_target
    return sum(row["total_sum"] or 0.0 for row in rows) / labelled, by_target


@dg.asset(
    key="turn_rewards",
    deps=["lake_events"],
    group_name="reward",
    kinds={"duckdb", "parquet"},
    # One settling pass at a time across every run (assets/pools.py): each pass settles every
    # target's turns, so two loop runs at once do the work once, the second finding nothing new.
    pool=REWARDS_POOL,
    description="Per-turn rewards (explicit and implicit feedback, session outcomes, tool-call outcomes) "
                "from the lake, by a versioned per-tenant/task spec. Only new events are read each run; a "
                "turn is written once, when it settles; later events land in reward_corrections.",
    check_specs=[
        dg.AssetCheckSpec(UNLABELLED, asset="turn_rewards",
                          description="Share of this run's settled turns with no signal stays under the limit."),
        dg.AssetCheckSpec(BOUNDS, asset="turn_rewards", blocking=True,
                          description="Components on [-1, 1], totals within the spec's bound; blocks training."),
        dg.AssetCheckSpec(DRIFT, asset="turn_rewards",
                          description="Each component's mean vs previous runs: a move the explicit votes "
                                      "explain (a promoted model) is information; one they do not is reward "
                                      "hacking or a broken client."),
    ],
    # Materialized by every reward run (on the ingest cadence, */5), new events or not, because
    # settling needs only time to pass: three missed runs warn, six fail.
    freshness_policy=dg.FreshnessPolicy.time_window(fail_window=timedelta(minutes=30),
                                                    warn_window=timedelta(minutes=15)),
)
def turn_rewards(context: dg.AssetExecutionContext, config: RewardRunConfig,
                 lake: LakeResource) -> dg.MaterializeResult:
    cfg = lake.settings()
    book = load_spec_book(config.spec_path) if config.spec_path else reward_spec_book(cfg)  # read now: an
                                                                                           # edited spec needs no restart
    now = None
    if config.now:
        now = datetime.fromisoformat(config.now)
        now = now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now.astimezone(timezone.utc)
    r = run_rewards(cfg.lake, book, now=now, tables=cfg.table_store)
    context.log.info(f"rewards {r.run_id}: {r.new_signals} new signals, {r.settled} settled, "
                     f"{r.provisional} provisional, corrections {r.corrections}")
    limits = CheckLimits(max_unlabelled_share=config.max_unlabelled_share,
                         drift_warn=config.drift_warn, drift_error=config.drift_error,
                         votes_share=config.votes_share)
    outcomes = evaluate(cfg.table_store, r, book, limits)
    mean, by_target = settled_means(r.tables.settled if r.tables else None)
    return dg.MaterializeResult(
        metadata={
            "run_id": r.run_id,
            "reward_seq": r.seq if r.seq is not None else -1,
            "committed": r.committed,
            "new_event_files": r.new_files,
            "new_signals": r.new_signals,
            "turns_settled": r.settled,
            "turns_settled_unlabelled": r.settled_unlabelled,
            "mean_reward": dg.MetadataValue.float(mean) if mean is not None else dg.MetadataValue.null(),
            "mean_reward_by_target": dg.MetadataValue.json(by_target),
            "turns_provisional": r.provisional,
            "pending_signals": r.pending_signals,
            "orphans_pending": r.orphans_pending,
            "corrections": dg.MetadataValue.json(r.corrections),
            "spec_versions": dg.MetadataValue.json(r.spec_versions),
            # how each hindsight signal (the next user message) agreed with the votes on the same turns
            "hindsight_vs_votes": dg.MetadataValue.json(
                {kind: {"turns": a.count, "agree": a.agree, "accuracy": _rounded(a.accuracy),
                        "accuracy_low": _rounded(a.accuracy_low), "suggested_weight": _rounded(a.weight)}
                 for kind, a in r.hindsight_calibration.items()}),
            "seconds": round(r.seconds, 2),
        },
        check_results=[
            dg.AssetCheckResult(check_name=o.name, passed=o.passed,
                                severity=dg.AssetCheckSeverity(o.severity),
                                metadata={k: dg.MetadataValue.json(v) if isinstance(v, (dict, list)) else v
                                          for k, v in o.metadata.items()})
            for o in outcomes
        ],
    )


reward_job = dg.define_asset_job(
    "reward_job", selection=[turn_rewards],
    description="Settle per-turn rewards from the lake's new events (incremental, by the reward spec).")

# Two minutes after each ingest run (ingest runs on */5): settling needs time to pass, so rewards
# run on a clock even when no new event arrived.
reward_schedule = dg.ScheduleDefinition(
    name="rewards_every_5_minutes", job=reward_job, cron_schedule="2-59/5 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Two minutes after each ingest run: settle the turns whose feedback window closed.",
)

reward_assets = [turn_rewards]
reward_jobs = [reward_job]
reward_schedules = [reward_schedule]


def _rounded(x: float) -> float | None:
    """3 decimals for the UI; None for NaN (no turn to measure), which JSON cannot carry."""
    return None if x != x else round(x, 3)
