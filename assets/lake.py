"""Lake maintenance: `lake_vacuum_job`, daily, deletes the data files no commit names in the
Delta tables: those writers killed before their commit left, and those of the reward stage's
dropped snapshots (`pipelines/lake/delta.py`: `vacuum`, the same as `tracerl lake vacuum`).
Nothing reads such a file; they only take space."""

import dagster as dg

from assets.resources import LakeResource


@dg.op(description="Delete the Delta tables' data files no commit names, older than a day.")
def vacuum_lake_tables(context: dg.OpExecutionContext, lake: LakeResource) -> None:
    from pipelines.lake import delta

    tables = lake.settings().table_store
    for dataset in delta.PARTITIONS:
        removed = delta.vacuum(tables, dataset)
        context.log.info(f"{dataset}: {len(removed)} orphan files deleted")


@dg.job(description="Delete the files writers killed mid-commit left in the lake's Delta tables.")
def lake_vacuum_job():
    vacuum_lake_tables()


lake_vacuum_schedule = dg.ScheduleDefinition(
    name="lake_vacuum_daily", job=lake_vacuum_job, cron_schedule="41 3 * * *", default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Daily at 03:41: delete the orphan data files of the lake's Delta tables.")

lake_jobs = [lake_vacuum_job]
lake_schedules = [lake_vacuum_schedule]
