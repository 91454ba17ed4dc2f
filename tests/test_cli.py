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
