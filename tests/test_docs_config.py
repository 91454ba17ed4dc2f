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


def test_the_kubernetes_values_keep_the_local_instance_s_concurrency_rules():
    """docs/k8s/dagster-values.yaml is the cluster's dagster.yaml: the same pools, run queue, one run
    per target and slot clean-up as dagster_home/dagster.yaml (what the local tests show holding)."""
    import yaml

    instance = yaml.safe_load((ROOT / "dagster_home" / "dagster.yaml").read_text())
    local = instance["concurrency"]
    values = yaml.safe_load((ROOT / "docs" / "k8s" / "dagster-values.yaml").read_text())
    chart = values["concurrency"]
    assert chart["pools"]["defaultLimit"] == local["pools"]["default_limit"]
    assert chart["pools"]["granularity"] == local["pools"]["granularity"]
    monitoring = values["dagsterDaemon"]["runMonitoring"]
    assert monitoring["enabled"] and instance["run_monitoring"]["enabled"]
    assert monitoring["freeSlotsAfterRunEndSeconds"] == instance["run_monitoring"]["free_slots_after_run_end_seconds"]
    assert chart["runs"]["maxConcurrentRuns"] == local["runs"]["max_concurrent_runs"]
    assert chart["runs"]["tagConcurrencyLimits"] == local["runs"]["tag_concurrency_limits"]
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["dagsterDaemon"]["runCoordinator"]["type"] == "QueuedRunCoordinator"
    (code,) = values["dagster-user-deployments"]["deployments"]
    assert code["dagsterApiGrpcArgs"] == ["-m", "assets.definitions"]
