"""Ingest asset: Kafka -> Parquet lake, one bounded exactly-once batch per run."""


import dagster as dg

from assets.resources import TracerlResource
from pipelines.ingest.run import run_ingest

QUARANTINE_CHECK = "quarantine_rate"


class IngestRunConfig(dg.Config):
    max_events: int | None = None  # None: the configured ingest.max_events


@dg.asset(
    key="lake_events",
    group_name="ingest",
    kinds={"kafka", "parquet", "duckdb"},
    description="Trace events consumed from Kafka and landed in the Parquet lake exactly once; "
                "invalid messages land in the quarantine dataset with their reason.",
    check_specs=[dg.AssetCheckSpec(QUARANTINE_CHECK, asset="lake_events",
                                   description="Share of this run's messages quarantined stays under the limit.")],
)
def lake_events(context: dg.AssetExecutionContext, config: IngestRunConfig,
                tracerl: TracerlResource) -> dg.MaterializeResult:
    cfg = tracerl.load()
    r = run_ingest(cfg, max_events=config.max_events)
    context.log.info(f"ingest {r.run_id}: {r.landed} landed, {r.quarantined} quarantined, "
                     f"{r.duplicates} duplicates, kafka commit {r.kafka_commit}")
    limit = cfg.ingest.quarantine_rate_limit
    return dg.MaterializeResult(
        metadata={
            "run_id": r.run_id,
            "messages_consumed": r.consumed,
            "rows_written": r.landed,
            "rows_quarantined": r.quarantined,
            "duplicates_skipped": r.duplicates,
            "already_landed": r.already_landed,
            "quarantine_reasons": dg.MetadataValue.json(r.reasons),
            "offsets_consumed": dg.MetadataValue.json(r.offsets),
            "files": dg.MetadataValue.json(r.files),
            "kafka_commit": r.kafka_commit,
            "seconds": round(r.seconds, 2),
        },
        check_results=[dg.AssetCheckResult(
            check_name=QUARANTINE_CHECK,
            passed=r.quarantine_rate <= limit,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"quarantine_rate": r.quarantine_rate, "limit": limit, "reasons": dg.MetadataValue.json(r.reasons)},
        )],
    )


ingest_job = dg.define_asset_job("ingest_job", selection=[lake_events])

ingest_schedule = dg.ScheduleDefinition(
    name="ingest_every_5_minutes", job=ingest_job, cron_schedule="*/5 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
