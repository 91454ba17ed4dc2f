"""One reward-spec resolution: the configuration names the spec (`[reward] spec`, per target
overridable), the CLI and Dagster's `turn_rewards` score with the same versions, and an edited
spec scores the next run of a long-lived Dagster resource (no restart)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from assets.resources import TracerlResource, service_resources
from assets.reward import turn_rewards
from tracerl.cli import main
from pipelines.config import TracerlConfig, load_config
from pipelines.lake.query import connect
from pipelines.reward.spec import fallback_spec_path, reward_spec_book, spec_path
from reward_lake import T0, fb, land, turn

NOW = (T0 + timedelta(days=2)).isoformat()


def _spec(path: Path, version: str, grace: int = 900) -> Path:
    path.write_text(f'version = "{version}"\n[default]\nsettle = {{ session_end_grace_s = {grace} }}\n')
    return path


def _traffic(lake: Path, prefix: str, tenants=("acme", "globex")) -> None:
    land(lake, [e for tenant in tenants for i in range(2)
                for e in (turn(f"{prefix}-{tenant}-{i}", 0, i, tenant=tenant),
                          fb(f"{prefix}-{tenant}-{i}", "thumbs", t=i + 1, value=1, tenant=tenant))])


def _materialize(resources: dict) -> list[str]:
    result = dg.materialize([turn_rewards], resources=resources,
                            run_config={"ops": {"turn_rewards": {"config": {"now": NOW}}}})
    return result.asset_materializations_for_node("turn_rewards")[0].metadata["spec_versions"].value


def _row_versions(cfg: TracerlConfig) -> dict[str, str]:
    rows = connect(cfg.lake).sql("SELECT tenant, spec_version FROM rewards").fetchall()
    return dict(sorted(set(rows)))


@pytest.fixture(autouse=True)
def _no_fallbacks(monkeypatch, tmp_path):
    for name in ("TRACERL_REWARD_SPEC", "TRACERL_HOME", "TRACERL_CONFIG"):  # the CLI exports TRACERL_CONFIG:
        monkeypatch.setenv(name, "-")                                         # restore it afterwards
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no ./rewards.toml, no ./tracerl.toml


def test_an_edited_spec_scores_the_next_run_without_a_restart(tmp_path):
    spec = _spec(tmp_path / "rewards-a.toml", "a1")
    toml = tmp_path / "tracerl.toml"
    toml.write_text(f'home = "{tmp_path / "home"}"\n[reward]\nspec = "rewards-a.toml"\n')  # relative to the file
    resources = service_resources(TracerlResource(config_path=str(toml)))  # built once, as a running code
                                                                           # location keeps them
    lake = load_config(toml).lake

    _traffic(lake, "first")
    first = _materialize(resources)
    assert first and all(v.startswith("a1+") for v in first), first

    _spec(spec, "a2")  # the operator edits the spec; Dagster keeps running
    _traffic(lake, "second")
    second = _materialize(resources)
    assert second and all(v.startswith("a2+") for v in second), second

    b = _spec(tmp_path / "rewards-b.toml", "b1")  # ... or points the config at another file
    toml.write_text(f'home = "{tmp_path / "home"}"\n[reward]\nspec = "{b}"\n')
    _traffic(lake, "third")
    assert all(v.startswith("b1+") for v in _materialize(resources))


def test_cli_and_dagster_score_with_the_same_versions_per_target(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    _spec(conf / "everyone.toml", "all-1")
    _spec(conf / "acme.toml", "acme-1", grace=0)
    toml = conf / "tracerl.toml"
    toml.write_text('[reward]\nspec = "everyone.toml"\n[targets."acme".reward]\nspec = "acme.toml"\n')
    elsewhere = tmp_path / "elsewhere"  # the CLI runs in another folder than Dagster does
    elsewhere.mkdir()

    monkeypatch.setenv("TRACERL_HOME", str(tmp_path / "cli-home"))
    cli_cfg = load_config(toml)
    _traffic(cli_cfg.lake, "t")
    monkeypatch.chdir(elsewhere)
    assert main(["--config", str(toml), "reward", "--now", NOW]) == 0

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRACERL_HOME", str(tmp_path / "dagster-home"))
    dagster_cfg = load_config(toml)
    _traffic(dagster_cfg.lake, "t")
    versions = _materialize(service_resources(TracerlResource(config_path=str(toml))))

    by_tenant = _row_versions(cli_cfg)
    assert by_tenant == _row_versions(dagster_cfg)
    assert by_tenant["acme"].startswith("acme-1+") and by_tenant["globex"].startswith("all-1+")
    assert sorted(versions) == sorted(by_tenant.values())


def test_resolution_order(tmp_path, monkeypatch):
    cfg = TracerlConfig()
    assert spec_path(cfg) is None and reward_spec_book(cfg).resolve("acme", None).version == "builtin-1"
    _spec(tmp_path / "rewards.toml", "cwd")
    assert spec_path(cfg) == tmp_path / "rewards.toml" == fallback_spec_path()  # absolute, for Dagster's env
    _spec(tmp_path / "env.toml", "env")
    monkeypatch.setenv("TRACERL_REWARD_SPEC", "env.toml")
    assert spec_path(cfg) == tmp_path / "env.toml"
    cfg.reward.spec = str(_spec(tmp_path / "conf.toml", "conf"))  # the configuration wins
    assert reward_spec_book(cfg).resolve("acme", "x").version == "conf"
    target = TracerlConfig(targets={"acme/x": {"reward": {"spec": str(_spec(tmp_path / "x.toml", "x"))}}})
    target.reward.spec = cfg.reward.spec
    book = reward_spec_book(target)
    assert [book.resolve(t, k).version for t, k in (("acme", "x"), ("acme", "y"), ("*", None))] == ["x", "conf", "conf"]


def test_a_missing_spec_file_fails_the_run_naming_it(tmp_path):
    cfg = TracerlConfig(home=tmp_path / "home")
    cfg.reward.spec = str(tmp_path / "nope.toml")
    with pytest.raises(FileNotFoundError, match="nope.toml does not exist"):
        reward_spec_book(cfg)
