"""Resources: how Dagster reaches tracerl's configuration and services.

One resource wraps `TracerlConfig`; the embedded-vs-external choice of every
service lives in that config, not in asset code.
"""


import dagster as dg

from pipelines.config import TracerlConfig, load_config


class TracerlResource(dg.ConfigurableResource):
    """tracerl settings: a tracerl.toml path and/or a state folder (env vars apply too).

    Loaded again by every run (``load``), so an edited tracerl.toml or reward spec is picked up
    without restarting Dagster.
    """

    config_path: str | None = None   # None: $TRACERL_CONFIG, else ./tracerl.toml (none is fine)
    home: str | None = None          # overrides `home`
    reward_spec: str | None = None   # overrides `reward.spec` (per-target entries still win), e.g. the
                                     # simulator's spec for an in-process demo run

    def load(self) -> TracerlConfig:
        overrides: dict = {"home": self.home} if self.home else {}
        if self.reward_spec:
            overrides["reward"] = {"spec": self.reward_spec}
        return load_config(self.config_path, **overrides)

