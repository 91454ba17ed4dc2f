"""The configuration reference names every environment variable the code reads, and what it says
about the repository's own files holds."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "configuration.md").read_text()


def test_every_tracerl_variable_the_code_reads_is_documented():
    read = set()
    for folder in ("pipelines", "assets", "tracerl", "bench", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r"TRACERL_[A-Z][A-Z_]*[A-Z]", path.read_text(errors="replace")))
    documented = set(re.findall(r"`(TRACERL_[A-Z_]+)`", DOC))
    assert read - documented == set(), "read by the code, missing from docs/configuration.md"


def test_tracerl_toml_is_ignored_by_git_as_the_docs_say():
    assert "`tracerl.toml` at the repository root is in `.gitignore`" in DOC
    out = subprocess.run(["git", "check-ignore", "-q", "tracerl.toml"], cwd=ROOT)
    assert out.returncode == 0
