"""Ingest assets: the Kafka topic as an observed source, and Kafka -> Parquet lake, one bounded
exactly-once batch per run."""

import warnings
from datetime import timedelta

import dagster as dg

from assets.pools import INGEST_POOL
from assets.resources import KafkaResource, LakeResource
from pipelines.contract.validate import INTERNAL_ERROR

QUARANTINE_CHECK = "quarantine_rate"
ISOLATION_CHECK = "no_internal_errors"
LAG_CHECK = "lake_lag"


with warnings.catch_warnings():
    # Observable source assets are marked beta in Dagster 1.13; this is a deliberate use. The
    # multi_ form takes an AssetSpec (so `kinds` is native) and, unlike `observable_source_asset`,
    # builds no SourceAsset, whose conversion trips a Dagster-internal DeprecationWarning.
    warnings.simplefilter("ignore", dg.BetaWarning)

    @dg.multi_observable_source_asset(
        name="raw_events",
        specs=[dg.AssetSpec(
            "raw_events", group_name="ingest", kinds={"kafka"},
            description="The Kafka events topic (kafka.topic). Observed, not materialized: its data "
                        "version is the sum of the partitions' end offsets, so it changes when events "
                        "arrive; metadata carries the offsets and those ingest committed.")],
    )
    def raw_events(context: dg.AssetExecutionContext, kafka: KafkaResource):
        o = kafka.offsets()
        context.log.info(f"{o['topic']} on {o['bootstrap_servers']}: end offsets {o['end_offsets']}, "
                         f"committed by {o['group_id']} {o['committed_offsets']}")
        return dg.ObserveResult(
            asset_key="raw_events",
            data_version=dg.DataVersion(str(o["end_offset_total"])),
            metadata={
                "topic": o["topic"],
                "bootstrap_servers": o["bootstrap_servers"],
                "partitions": len(o["end_offsets"]),
                "end_offset_total": o["end_offset_total"],
                "end_offsets": dg.MetadataValue.json(o["end_offsets"]),
                # what ingest committed for Kafka's lag tools; the lake's own lag is the lake_lag check
                "consumer_group": o["group_id"],
                "committed_offsets": dg.MetadataValue.json(o["committed_offsets"]),
            },
        )


class IngestRunConfig(dg.Config):
    max_events: int | None = None  # None: the configured ingest.max_events


@dg.asset(
    key="lake_events",
    deps=[raw_events],
    group_name="ingest",
    kinds={"kafka", "parquet", "duckdb"},
    pool=INGEST_POOL,  # one lander at a time across runs: a second loop's ingest finds nothing new
    description="Trace events consumed from Kafka and landed in the Parquet lake exactly once; "
                "invalid messages land in the quarantine dataset with their reason.",
    check_specs=[dg.AssetCheckSpec(QUARANTINE_CHECK, asset="lake_events",
                                   description="Share of this run's messages quarantined stays under the limit."),
                 # Not blocking: the run landed every other message; the red check is for us, not the data.
                 dg.AssetCheckSpec(ISOLATION_CHECK, asset="lake_events",
                                   description="No message made decode raise. Red: the run isolated such "
                                               "messages into the quarantine (reason internal_error) and landed "
                                               "the rest; the decoder has a bug to fix.")],
    # Materialized by every ingest run (*/5; a run may take up to ingest.max_run_seconds = 10 min):
    # three missed runs warn, six fail.
    freshness_policy=dg.FreshnessPolicy.time_window(fail_window=timedelta(minutes=30),
                                                    warn_window=timedelta(minutes=15)),
)
def lake_events(context: dg.AssetExecutionContext, config: IngestRunConfig, kafka: KafkaResource,
                lake: LakeResource) -> dg.MaterializeResult:
    cfg = lake.settings()
    r = kafka.ingest(config.max_events)
    context.log.info(f"ingest {r.run_id}: {r.landed} landed, {r.quarantined} quarantined, "
                     f"{r.duplicates} duplicates, kafka commit {r.kafka_commit}")
    limit = cfg.ingest.quarantine_rate_limit
    internal = r.reasons.get(INTERNAL_ERROR, 0)
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
            "table_versions": dg.MetadataValue.json(r.versions),  # the Delta versions this run committed
            "kafka_commit": r.kafka_commit,
            "internal_errors": internal,
            "decode_failure": r.isolated or "",
            "seconds": round(r.seconds, 2),
            "lake": dg.MetadataValue.path(str(cfg.lake)),
        },
        check_results=[dg.AssetCheckResult(
            check_name=QUARANTINE_CHECK,
            passed=r.quarantine_rate <= limit,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"quarantine_rate": r.quarantine_rate, "limit": limit, "reasons": dg.MetadataValue.json(r.reasons)},
        ), dg.AssetCheckResult(
            check_name=ISOLATION_CHECK,
            passed=internal == 0,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"internal_errors": internal, "decode_failure": r.isolated or ""},
        )],
    )


# Each run observes the topic (offsets, lag before this batch), then lands the batch.
ingest_job = dg.define_asset_job(
    "ingest_job", selection=[raw_events, lake_events],
    description="Observe the Kafka topic (offsets, consumer lag), then land one bounded batch in the lake "
                "exactly once. The closed loop runs the same two assets at the start of every iteration.")

ingest_schedule = dg.ScheduleDefinition(
    name="ingest_every_5_minutes", job=ingest_job, cron_schedule="*/5 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every 5 minutes: land what arrived on Kafka, so the lake trails the topic by minutes.",
)

@dg.asset_check(asset=lake_events, name=LAG_CHECK, blocking=False,
                description="The lake keeps up with Kafka: red when the oldest event in Kafka that the lake does not "
                            "hold is older than ingest.lag_alarm_seconds, or more than ingest.lag_alarm_events "
                            "wait (read from the lake's own watermarks, not the consumer group). Runs after "
                            "each ingest and on its own every 5 minutes, so it goes red while ingest cannot run.")
def lake_lag(context: dg.AssetCheckExecutionContext, kafka: KafkaResource, lake: LakeResource) -> dg.AssetCheckResult:
    from pipelines.ingest.offsets import IngestError

    cfg = lake.settings()
    try:
        lag = kafka.lag().summary(cfg)
    except IngestError as e:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR,
                                   description=f"the lag cannot be measured: {e}", metadata={"error": str(e)})
    context.log.info(f"lake lag: {lag['behind']} events, oldest {lag['oldest_age_s']} s ({lag['alarm'] or 'ok'})")
    return dg.AssetCheckResult(
        passed=lag["ok"], severity=dg.AssetCheckSeverity.ERROR,
        description=lag["alarm"] or f"{lag['behind']} events waiting, the oldest {lag['oldest_age_s']:.0f} s old",
        metadata={"events_behind": lag["behind"], "oldest_age_s": lag["oldest_age_s"],
                  "lag_alarm_seconds": cfg.ingest.lag_alarm_seconds, "lag_alarm_events": cfg.ingest.lag_alarm_events,
                  "by_partition": dg.MetadataValue.json({p: {k: v[k] for k in ("landed", "end", "behind")}
                                                         for p, v in lag["partitions"].items()})})


lake_lag_job = dg.define_asset_job(
    "lake_lag_job", selection=dg.AssetSelection.checks(lake_lag),
    description="Measure the lake's lag behind Kafka (the lake_lag check) without ingesting.")

lake_lag_schedule = dg.ScheduleDefinition(
    name="lake_lag_every_5_minutes", job=lake_lag_job, cron_schedule="2-59/5 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every 5 minutes, between ingest runs: the lake_lag check on its own, so it turns red while "
                "ingest runs fail or cannot start.")

ingest_assets = [raw_events, lake_events, lake_lag]
ingest_jobs = [ingest_job, lake_lag_job]
ingest_schedules = [ingest_schedule, lake_lag_schedule]
