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


class TargetsConfig(dg.Config):
    """Run config shared by the closed-loop assets, so many adapters train side by side."""

    targets: list[str] = []  # "tenant/task"; empty: every tenant/task

    def pairs(self) -> list[tuple[str, str]]:
        out = []
        for t in self.targets:
            tenant, sep, task = t.partition("/")
            if not (sep and tenant and task):
                raise ValueError(f"target {t!r} is not of the form tenant/task")
            out.append((tenant, task))
        return out
