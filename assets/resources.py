"""Resources: how Dagster reaches tracerl's configuration and services.

One resource wraps `TracerlConfig`; the embedded-vs-external choice of every
service lives in that config, not in asset code.
"""


import dagster as dg

from pipelines.config import TracerlConfig, load_config


class TracerlResource(dg.ConfigurableResource):
    """tracerl settings: a tracerl.toml path and/or a state folder (env vars apply too)."""

    config_path: str | None = None
    home: str | None = None

    def load(self) -> TracerlConfig:
        overrides = {"home": self.home} if self.home else {}
        return load_config(self.config_path, **overrides)
