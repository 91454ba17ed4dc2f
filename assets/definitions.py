"""The Dagster code location: every tracerl asset, check, job, schedule, sensor and resource.

`DAGSTER_HOME=dagster_home dagster dev` (or `make dagster`) shows it.
"""

import dagster as dg

from assets import deploy, gate, ingest, reward, train
from assets.resources import TracerlResource

defs = dg.Definitions(
    assets=[ingest.lake_events, *reward.reward_assets, *train.train_assets, *deploy.deploy_assets],
    asset_checks=[*gate.gate_checks],
    jobs=[ingest.ingest_job, *reward.reward_jobs, *train.train_jobs, *gate.gate_jobs],
    schedules=[ingest.ingest_schedule, *reward.reward_schedules],
    sensors=[*train.train_sensors, *gate.gate_sensors],
    resources={"tracerl": TracerlResource()},
)
