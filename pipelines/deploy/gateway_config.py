"""The gateway's settings live at the ground, in ``pipelines.config.gateway``; re-exported here."""

from pipelines.config.gateway import GatewayConfig  # noqa: F401
