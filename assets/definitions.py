"""The Dagster code location: every tracerl asset, check, job, schedule and resource.

`DAGSTER_HOME=dagster_home dagster dev` (or `make dagster`) shows it.
"""

import dagster as dg

from assets import ingest
from assets.resources import TracerlResource

defs = dg.Definitions(
    assets=[ingest.lake_events],
    jobs=[ingest.ingest_job],
    schedules=[ingest.ingest_schedule],
    resources={"tracerl": TracerlResource()},
)
