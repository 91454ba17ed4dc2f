"""Data rights in Dagster: `retention_job`, daily, deletes every tenant's raw traffic past its
`privacy.retention_days` from the lake, the gateway's journal and spill, and the gate's review
tables in MLflow (`pipelines/rights/retention.py`, the same as `tracerl retention apply`). The run's
output metadata is the report: what went per store and tenant, the cutoffs, the files vacuumed."""

import dagster as dg

from assets.resources import LakeResource, MlflowResource


class RetentionConfig(dg.Config):
    dry_run: bool = False       # count only: nothing deleted
    now: str | None = None      # ISO 8601 time the periods count back from (default: the clock)


@dg.op(description="Delete each tenant's traffic older than its retention period from every store, vacuum "
                   "the removed files and expire the Delta log before the deletes.")
def apply_retention_periods(context: dg.OpExecutionContext, config: RetentionConfig, lake: LakeResource,
                            mlflow: MlflowResource) -> dg.Output[dict]:
    from datetime import datetime

    from pipelines.rights.retention import STORES, apply_retention

    cfg = lake.settings()
    mlflow.use_store()  # the review tables live in the configured MLflow store
    report = apply_retention(cfg, now=datetime.fromisoformat(config.now) if config.now else None,
                             dry_run=config.dry_run)
    for line in report.lines():
        context.log.info(line)
    metadata = {f"deleted.{store}": dg.MetadataValue.int(report.total(store)) for store in STORES}
    metadata.update({
        "deleted.by_tenant": dg.MetadataValue.json(report.deleted),
        "cutoffs": dg.MetadataValue.json(report.cutoffs),
        "default_cutoff": dg.MetadataValue.text(report.default_cutoff or "kept"),
        "gateway_files": dg.MetadataValue.json(report.segment_files),
        "files_vacuumed": dg.MetadataValue.int(sum(report.vacuumed.values())),
        "log_entries_expired": dg.MetadataValue.int(sum(report.log_expired.values())),
        "dry_run": dg.MetadataValue.bool(report.dry_run),
        "seconds": dg.MetadataValue.float(round(report.seconds, 3)),
    })
    return dg.Output(report.to_dict(), metadata=metadata)


@dg.job(description="Delete every tenant's raw traffic past its retention period (privacy.retention_days): "
                    "lake rows, gateway journal and spill segments, review tables.")
def retention_job():
    apply_retention_periods()


retention_schedule = dg.ScheduleDefinition(
    name="retention_daily", job=retention_job, cron_schedule="23 2 * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Daily at 02:23: each tenant's traffic past its retention period leaves every store "
                "(docs/privacy.md, Retention).")

class ForgetConfig(dg.Config):
    now: str | None = None      # ISO 8601 time the retrain deadlines are checked at (default: the clock)


@dg.op(description="Carry out the forget requests filed through the gateway's POST /admin/forget (or "
                   "interrupted), then replace every champion trained on a forgotten user whose retrain "
                   "deadline passed (pipelines/rights/forget.py, forget_deadline.py).")
def forget_users(context: dg.OpExecutionContext, config: ForgetConfig, lake: LakeResource,
                 mlflow: MlflowResource) -> dg.Output[dict]:
    from datetime import datetime

    from pipelines.rights.forget import run_open_requests
    from pipelines.rights.forget_deadline import enforce_deadline

    cfg = lake.settings()
    mlflow.use_store()
    receipts = [r.to_dict() for r in run_open_requests(cfg)]
    for r in receipts:
        context.log.info(f"forget {r['id']} of {r['tenant']}: {r['counts']}")
    moved = enforce_deadline(cfg, datetime.fromisoformat(config.now) if config.now else None)
    for m in moved:
        context.log.info(f"deadline: {m}")
    return dg.Output({"receipts": receipts, "deadline": moved},
                     metadata={"forgotten": dg.MetadataValue.int(len(receipts)),
                               "champions_replaced": dg.MetadataValue.int(len(moved)),
                               "receipts": dg.MetadataValue.json([{k: r[k] for k in ("id", "tenant", "counts",
                                                                                     "versions_marked", "deadline")}
                                                                  for r in receipts])})


@dg.job(description="Forget: filed requests carried out, retrain deadlines enforced (docs/privacy.md#forget).")
def forget_job():
    forget_users()


forget_schedule = dg.ScheduleDefinition(
    name="forget_hourly", job=forget_job, cron_schedule="7 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Hourly: forget requests filed through the gateway are carried out, and a champion trained "
                "on a forgotten user is replaced once its retrain deadline passes (docs/privacy.md#forget).")

privacy_jobs = [retention_job, forget_job]
privacy_schedules = [retention_schedule, forget_schedule]
