"""Every CLI command has --help, and it answers without importing the heavy stack."""

import subprocess
import sys

import pytest

from tracerl.cli import build_parser, main


def _commands():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(sub.choices)


@pytest.mark.parametrize("command", _commands())
def test_help_on_every_command(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert f"usage: tracerl {command}" in capsys.readouterr().out


def test_help_is_fast_no_torch_or_dagster_import():
    code = "import sys; from tracerl.cli import build_parser; build_parser(); " \
           "print(any(m in sys.modules for m in ('torch', 'dagster', 'mlflow', 'kafka')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_unknown_service_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        main(["start", "postgres"])
    assert "unknown service" in capsys.readouterr().err


def test_sql_on_an_empty_lake(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRACERL_HOME", str(tmp_path))
    assert main(["--config", str(tmp_path / "none.toml"), "sql", "SELECT count(*) AS n FROM turns"]) == 0
    assert "n" in capsys.readouterr().out


def test_simulate_without_a_gateway_says_how_to_start_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRACERL_HOME", str(tmp_path))
    assert main(["--config", str(tmp_path / "none.toml"), "simulate", "--requests", "1"]) == 1
    assert "no gateway: start the stack with `tracerl up`" in capsys.readouterr().err


def test_status_lists_the_whole_stack(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRACERL_HOME", str(tmp_path))
    assert main(["--config", str(tmp_path / "none.toml"), "status"]) == 0
    out = capsys.readouterr().out
    for name in ("kafka", "mlflow", "vllm", "gateway", "dagster"):
        assert f"{name}:" in out
    assert main(["--config", str(tmp_path / "none.toml"), "down"]) == 0  # nothing started: nothing stopped
    assert capsys.readouterr().out.count("was not running") == 5


def test_the_services_a_command_starts_read_its_config_file(tmp_path, capsys, monkeypatch):
    """`tracerl --config F up` starts the gateway and Dagster as processes that load their own
    config: they must get F, not ./tracerl.toml."""
    import os

    monkeypatch.delenv("TRACERL_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf" / "mine.toml"
    conf.parent.mkdir()
    conf.write_text(f'home = "{tmp_path / "home"}"\n')
    assert main(["--config", "conf/mine.toml", "status"]) == 0
    assert os.environ["TRACERL_CONFIG"] == str(conf.resolve())
    capsys.readouterr()


def _peft(path):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text('{"r": 8}')
    (path / "adapter_model.safetensors").write_bytes(b"x" * 10)
    return path


def test_adapters_and_swaps_are_tables_marking_what_serves_and_what_was_decided(tmp_path, capsys, monkeypatch):
    """`tracerl adapters` without arguments lists every tenant/task; each version is marked from the
    gateway's routes (live, canary) and the registry (champion, challenger, the gate's status);
    `--tenant`/`--task` filter; `tracerl swaps` is a table of the swap log; `--json` the same rows."""
    import json

    from pipelines.adapters import promote, registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.config import load_config
    from pipelines.deploy.routing import Canary, Router

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    toml = tmp_path / "tracerl.toml"
    toml.write_text(f'home = "{tmp_path / "home"}"\n')
    cfg = load_config(toml)
    store = AdapterStore(cfg.adapter_root)
    meta = {"base_model_hash": "h", "reward_spec_version": None, "config": {}, "metrics": {}}
    for i, parent, window in ((1, None, None), (2, 1, {"turns": 40}), (3, 2, {"turns": 35})):
        store.publish("acme", "concise", _peft(tmp_path / f"a{i}"), {**meta, "parent_version": parent,
                                                                     "data_window": window})
    store.publish("globex", "support", _peft(tmp_path / "g1"), {**meta, "parent_version": None, "data_window": None})
    from pipelines import tracking

    for v in (1, 2, 3):
        with tracking.run(cfg, f"learner v{v}", tags={}, params={}) as run:
            pass
        registry.register_candidate(cfg, "acme", "concise", run.info.run_id, v, {})
    registry.set_alias(cfg, "acme", "concise", registry.CHAMPION, "1")
    promote.mark_rejected(cfg, "acme", "concise", "2")
    promote.enter_canary(cfg, "acme", "concise", "3", "test")
    router = Router(cfg.home / "deploy" / "routes.json")
    router.flip("acme", "concise", 1, "/a1")
    router.start_canary("acme", "concise", Canary(3, "/a3", 0.1, "c1", "2026-12-03T00:00:00Z"))
    swaps = cfg.home / "deploy" / "swaps.jsonl"
    swaps.write_text("".join(json.dumps(r) + "\n" for r in (
        {"at": "2026-12-03T10:00:00Z", "who": "gate", "action": "promote", "tenant": "acme", "task": "concise",
         "from": None, "to": 1, "ok": True, "requests": 12, "failed_requests": 0},
        {"at": "2026-12-03T11:00:00Z", "who": "op", "action": "canary_start", "tenant": "acme", "task": "concise",
         "from": 1, "to": 3, "ok": True, "requests": 3, "failed_requests": 0},
        {"at": "2026-12-03T12:00:00Z", "who": "gate", "action": "promote", "tenant": "globex", "task": "support",
         "from": None, "to": 1, "ok": False, "error": "vLLM refused: " + "x" * 500})))

    assert main(["--config", str(toml), "adapters"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["target", "version", "parent", "turns", "created", "(UTC)", "marks", "mlflow", "run"]
    by = {tuple(line.split()[:2]): line for line in lines[2:]}
    assert set(by) == {("acme/concise", "v1"), ("acme/concise", "v2"), ("acme/concise", "v3"),
                       ("globex/support", "v1")}
    assert " live champion " in by[("acme/concise", "v1")] + " " and "base" in by[("acme/concise", "v1")]
    assert "rejected" in by[("acme/concise", "v2")] and " 40 " in by[("acme/concise", "v2")]
    assert "canary challenger" in by[("acme/concise", "v3")]
    assert main(["--config", str(toml), "adapters", "--tenant", "globex", "--json"]) == 0
    [row] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert (row["tenant"], row["task"], row["version"], row["turns"], row["marks"]) == ("globex", "support", 1, None, [])

    assert main(["--config", str(toml), "swaps", "--task", "concise"]) == 0
    out = capsys.readouterr().out
    assert "canary_start" in out and "v1 -> v3" in out and "globex" not in out
    assert main(["--config", str(toml), "swaps", "--tenant", "globex"]) == 0
    out = capsys.readouterr().out
    assert "FAILED" in out and "x" * 60 not in out  # the error is cut, the table stays readable


def test_a_bad_target_is_one_bounded_error_line(tmp_path, capsys):
    toml = tmp_path / "tracerl.toml"
    toml.write_text(f'home = "{tmp_path / "home"}"\n')
    assert main(["--config", str(toml), "adapters", "--tenant", "../" * 2000]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 300 and "tenant=" in err and "(6002 chars)" in err


def test_sql_help_names_every_view_the_lake_has(tmp_path, capsys):
    from pipelines.lake.query import connect
    from tracerl.cli import SQL_VIEWS

    views = {r[0] for r in connect(tmp_path / "lake").execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall() if not r[0].startswith("_")}
    assert set(SQL_VIEWS) == views
    with pytest.raises(SystemExit):
        main(["sql", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(v in out for v in views)
