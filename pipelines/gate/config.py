"""The gate's settings live at the ground, in ``pipelines.config.gate``; re-exported here."""

from __future__ import annotations

from typing import Any

from pipelines.config.gate import TESTS, GateConfig, SignatureConfig  # noqa: F401


def gate_config(cfg: Any) -> GateConfig:
    """``cfg.gate`` (the defaults for an object without one, as some tests pass)."""
    return getattr(cfg, "gate", None) or GateConfig()
