"""Fixtures of the reward tests; helpers live in reward_lake.py (a plain module, importable by name)."""

from pathlib import Path

import pytest


@pytest.fixture
def lake_root(tmp_path) -> Path:
    return tmp_path / "lake"
