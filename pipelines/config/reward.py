"""``[reward]``: which reward spec scores the turns (the spec itself is its own TOML file)."""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION


@dataclass(config=SECTION)
class RewardConfig:
    """The reward spec file (docs/rewards.md); overridable per tenant or tenant/task.

    Read at every reward run (CLI or Dagster alike), so an edited spec is picked up by the next
    run without a restart. ``pipelines.reward.spec.reward_spec_book`` is the one resolver.
    """

    spec: str | None = None  # spec TOML; a relative path is relative to the tracerl.toml naming it
                             # (the CLI and Dagster run in different directories and must read the
                             # same file). None: $TRACERL_REWARD_SPEC, else ./rewards.toml, else
                             # the built-in spec (pipelines/reward/spec.py defaults)
