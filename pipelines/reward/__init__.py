"""Rewards: per-turn rewards from feedback and tool-call outcomes (see docs/rewards.md)."""
