"""The Dagster code location: every tracerl asset, check, job, schedule, sensor and resource.

Lineage: raw_events (the Kafka topic, observed) -> lake_events -> turn_rewards ->
candidate_adapter -> promotion (the gate, with its checks) -> deployment -> canary (a challenger
on a share of live traffic, assets/canary.py); the last four are partitioned by target (tenant/task). `closed_loop_job` (assets/loop.py) runs the whole chain for
one target: it is the loop, whoever starts it.

Resources: `tracerl` (the settings) and one per external service over it: `kafka`, `lake`, `mlflow`,
`gateway` (assets/resources.py); each asset asks only for the services it touches.

`DAGSTER_HOME=dagster_home dagster dev` (or `make dagster`) shows it.
"""

import dagster as dg

from assets import canary, deploy, gate, ingest, lake, loop, privacy, review, reward, train
from assets.resources import TracerlResource, service_resources

defs = dg.Definitions(
    assets=[*ingest.ingest_assets, *reward.reward_assets, *train.train_assets, *gate.gate_assets,
            *deploy.deploy_assets, *canary.canary_assets],
    jobs=[*ingest.ingest_jobs, *reward.reward_jobs, *loop.loop_jobs, *train.train_jobs, *review.review_jobs, *canary.canary_jobs,
          *lake.lake_jobs, *privacy.privacy_jobs],
    schedules=[*ingest.ingest_schedules, *reward.reward_schedules, *loop.loop_schedules, *lake.lake_schedules,
               *privacy.privacy_schedules],
    sensors=[*loop.loop_sensors, *review.review_sensors, *canary.canary_sensors],
    # Each service resource (kafka, lake, mlflow, gateway) nests the one `tracerl` settings resource;
    # configured at launch, so a run's config for `tracerl` (the UI launchpad, the in-process driver)
    # reaches every service. Its fields all default: no config = ./tracerl.toml or $TRACERL_CONFIG.
    resources=service_resources(TracerlResource.configure_at_launch()),
)
