"""The layers in pyproject's [tool.importlinter] hold: no module imports a layer above its own, the
siblings of a layer do not import each other, and pipelines/ never imports Dagster.

Runs the real `lint-imports` (the venv's, beside this interpreter) on the working tree, so a new
upward import fails `make test` with import-linter's report of the offending chain.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _lint_imports() -> str:
    exe = Path(sys.executable).parent / "lint-imports"
    if not exe.exists():
        found = shutil.which("lint-imports")
        if found is None:
            pytest.fail("lint-imports is not installed; run `pip install -e '.[dev]'` (import-linter>=2.16)")
        exe = Path(found)
    return str(exe)


def test_import_layers_hold():
    proc = subprocess.run([_lint_imports(), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"import-linter found a broken contract:\n{proc.stdout}\n{proc.stderr}"
    assert "0 broken" in proc.stdout
