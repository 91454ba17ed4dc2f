"""Fixtures of the learner's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def shared_models(tmp_path_factory):
    """One models folder for the session's proofs of learning: the tiny model is built once (atomic,
    cached by its recipe), not once per proof."""
    return tmp_path_factory.mktemp("models")
