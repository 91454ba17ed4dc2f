"""Every CLI command has --help, and it answers without importing the heavy stack; `--version`;
the listings (one table style, fast: no MLflow, torch or Dagster import); a fresh checkout lists no
tenant; `tracerl swaps` says who swapped and why, a gate promotion included."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tracerl.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]


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
    assert lines[0].split() == ["TARGET", "VERSION", "PARENT", "TURNS", "CREATED", "(UTC)", "MARKS", "MLFLOW", "RUN"]
    by = {tuple(line.split()[:2]): line for line in lines[1:]}
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
    assert "FAILED" in out and "x" * 80 not in out and "x..." in out  # the error is cut, the table stays readable


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


# -- --version -------------------------------------------------------------------------------------

def test_version_is_the_package_metadata_else_the_source(capsys, monkeypatch):
    from importlib import metadata

    import tomllib

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"tracerl {metadata.version('tracerl')}\n"

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)  # run from a source tree, not installed
    with pytest.raises(SystemExit):
        main(["--version"])
    source = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"tracerl {source}\n"


# -- a fresh checkout ------------------------------------------------------------------------------

def test_a_fresh_checkout_lists_no_tenant(tmp_path):
    """What a clone holds under evals/ (the files git tracks), the default config (suites_dir =
    "evals", relative to where tracerl runs) and a fresh home: `tracerl tenant list` shows no
    tenant: no simulator's, no example's (those are written where needed, pipelines/sim/evals.py)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "evals"], capture_output=True, text=True,
                             check=True).stdout.split()
    clone = tmp_path / "clone"
    for f in tracked:
        (clone / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, clone / f)
    assert (clone / "evals" / "_template" / "quality.toml").is_file()  # the template ships
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("TRACERL_", "MLFLOW_"))}
    run = subprocess.run([sys.executable, "-m", "tracerl", "--config", str(clone / "tracerl.toml"), "tenant", "list"],
                         cwd=clone, env={**env, "TRACERL_HOME": str(tmp_path / "home")}, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("no tenants"), run.stdout
    assert not (tmp_path / "home" / "mlflow.db").exists()  # listing created no store


# -- the listings: one style, and fast -------------------------------------------------------------

def _valid_adapter(path: Path, seed: int = 0) -> Path:
    """A LoRA adapter folder the deployer accepts: a real (tiny) safetensors file."""
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text('{"r": 8}')
    save_file({"lora_A": np.full((2, 2), seed, dtype=np.float32)}, str(path / "adapter_model.safetensors"))
    return path


@pytest.fixture
def listed_home(tmp_path, monkeypatch):
    """A home every listing has rows for: two adapter versions registered, a champion serving, a
    canary, a swap, a key, an eval suite, a consent record."""
    from pipelines import tracking
    from pipelines.adapters import registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.config import load_config
    from pipelines.deploy.keys import key_path, write_key_file
    from pipelines.deploy.routing import Router

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    toml = tmp_path / "tracerl.toml"
    toml.write_text(f'home = "{tmp_path / "home"}"\n[gate]\nsuites_dir = "{tmp_path / "evals"}"\n')
    cfg = load_config(toml)
    store = AdapterStore(cfg.adapter_root)
    meta = {"base_model_hash": "h", "reward_spec_version": None, "config": {}, "metrics": {}, "data_window": None}
    for v in (1, 2):
        store.publish("acme", "support", _valid_adapter(tmp_path / f"a{v}", v),
                      {**meta, "parent_version": v - 1 or None})
        with tracking.run(cfg, f"learner v{v}", tags={}, params={}) as run:
            pass
        registry.register_candidate(cfg, "acme", "support", run.info.run_id, v, {})
    registry.set_alias(cfg, "acme", "support", registry.CHAMPION, "2")
    Router(cfg.routes_path).flip("acme", "support", 2, str(store.get("acme", "support", 2).path))
    write_key_file(key_path(cfg.home, "acme"))
    (tmp_path / "evals" / "acme" / "support").mkdir(parents=True)
    (tmp_path / "evals" / "acme" / "support" / "q.toml").write_text('role = "primary"\nitems = "q.jsonl"\n'
                                                                  '[scorer]\nkind = "regex"\npattern = "x"\n')
    (tmp_path / "evals" / "acme" / "support" / "q.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "q"}]}\n')
    (cfg.home / "deploy" / "swaps.jsonl").write_text(json.dumps(
        {"at": "2026-12-03T10:00:00.000+00:00", "who": "alice", "why": "hotfix", "action": "deploy", "tenant": "acme",
         "task": "support", "from": "v1", "to": "v2", "ok": True, "requests": 4, "failed_requests": 0}) + "\n")
    assert main(["--config", str(toml), "consent", "set", "--tenant", "acme", "--user", "u1", "--opt-out",
                 "--reason", "asked"]) == 0
    return toml


LISTINGS = (["tenant", "list"], ["adapters"], ["swaps"], ["consent", "show", "--tenant", "acme"])


def test_every_listing_is_one_table_style(listed_home, capsys):
    """Upper-case headers, columns two spaces apart, no rule line; each cell starts where its
    header does (the same layout, whichever command)."""
    capsys.readouterr()
    for argv in LISTINGS:
        assert main(["--config", str(listed_home), *argv]) == 0
        lines = capsys.readouterr().out.splitlines()
        if argv[0] == "consent":
            lines = lines[1:]  # the policy line, then the table
        header, rows = lines[0], lines[1:]
        assert rows, argv
        assert header == header.upper() and not re.search(r"[-=+|]{3}", header), (argv, header)
        starts = [m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", header)]
        assert len(starts) >= 5, (argv, header)
        for row in rows:
            assert not set(row) <= set("-+= |"), (argv, row)  # no rule lines
            for i in starts:
                assert i == 0 or (row[i - 2:i] == "  " and row[i] != " "), (argv, header, row)


def test_listings_load_no_heavy_stack(listed_home):
    """`tenant list`, `adapters` and `swaps` read the registry's SQLite file, the routes and the
    swap log without importing MLflow, torch, Dagster, transformers or the gateway (importing
    MLflow alone takes seconds); `status` without MLflow, torch or Dagster."""
    heavy = ("mlflow", "torch", "dagster", "transformers", "aiohttp", "deltalake", "tabulate")
    for argv in (["tenant", "list"], ["adapters"], ["swaps"], ["status"]):
        code = ("import contextlib, io, json, sys; from tracerl.cli import main\n"
                "with contextlib.redirect_stdout(io.StringIO()) as out: rc = main(sys.argv[1:])\n"
                f"print(json.dumps([rc, sorted(m for m in {heavy!r} if m in sys.modules), out.getvalue()]))")
        run = subprocess.run([sys.executable, "-c", code, "--config", str(listed_home), *argv], capture_output=True,
                             text=True, check=True, cwd=REPO)
        rc, loaded, out = json.loads(run.stdout)
        allowed = {"deltalake"} if argv == ["status"] else set()  # status reads the lake path
        assert rc == 0 and set(loaded) <= allowed and out.count("\n") >= 2, (argv, loaded, out, run.stderr)


def test_the_fast_registry_read_agrees_with_mlflow(listed_home):
    """`registry_versions` (the SQLite read) gives what MLflow's client gives, tags and aliases."""
    from pipelines.adapters import promote
    from pipelines.config import load_config
    from pipelines.tenants import _client_versions, registry_versions

    cfg = load_config(listed_home)
    promote.mark_rejected(cfg, "acme", "support", "1")
    pairs = [("acme", "support"), ("acme", "nothing")]
    fast, slow = registry_versions(cfg, pairs), _client_versions(cfg, pairs)
    assert fast == slow and fast[("acme", "nothing")] == []
    [v1, v2] = fast[("acme", "support")]
    assert (v1.adapter_version, v1.tags[promote.STATUS], v2.aliases) == (1, promote.REJECTED, ("champion",))


# -- who swapped, and why --------------------------------------------------------------------------

@pytest.mark.slow
def test_swaps_say_who_and_why_for_gate_promotions_and_operators(tmp_path, capsys, monkeypatch):
    """The gate (real, scripted replies) promotes v1 and the gateway's own reconcile swaps it in
    (a real Deployer, vLLM's load and unload calls stubbed); then it promotes v2 and a reconcile
    outside the gateway swaps it through the gateway's swap route (which carries no reason); then an
    operator deploys v1 back. `tracerl swaps` names who did each and why: the gate's run and its
    decision, the operator's --why."""
    from types import SimpleNamespace

    from pipelines import tracking
    from pipelines.adapters import registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.config import load_config
    from pipelines.config.gate import GateConfig
    from pipelines.deploy import admin, operations
    from pipelines.deploy.deployer import Deployer
    from pipelines.deploy.reconcile import GatewayHandle, reconcile
    from pipelines.deploy.routing import Router
    from pipelines.gate.run import run_gate
    from tests.gate.gate_fixtures import FakeBackend, policy_for, write_suites

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    toml = tmp_path / "tracerl.toml"
    toml.write_text(f'home = "{tmp_path / "home"}"\n')
    cfg = load_config(toml)
    tenant, task = "acme", "qa"
    write_suites(tmp_path / "evals", tenant, task)
    gate = GateConfig(suites_dir=str(tmp_path / "evals"), temperature=0.0, samples_per_item=1)
    store = AdapterStore(cfg.adapter_root)
    meta = {"base_model_hash": "h", "reward_spec_version": [], "config": {}, "metrics": {}, "data_window": {}}
    rvs = {}
    for v in (1, 2):
        store.publish(tenant, task, _valid_adapter(tmp_path / f"a{v}", v), {**meta, "parent_version": v - 1 or None})
        with tracking.run(cfg, f"learner v{v}", tags={}, params={}) as run:
            pass
        rvs[v] = registry.register_candidate(cfg, tenant, task, run.info.run_id, v, {"tenant": tenant, "task": task})

    loads = []
    monkeypatch.setattr(admin, "load_adapter", lambda url, name, path: loads.append(name))
    monkeypatch.setattr(admin, "unload_adapter", lambda url, name: None)
    router = Router(cfg.routes_path)
    deployer = Deployer(router, ["http://vllm.invalid"], store, "h", cfg.home / "deploy" / "swaps.jsonl")
    inside = GatewayHandle(router, deployer.promote, deployer.start_canary, deployer.stop_canary, deployer.set_share)
    backend = FakeBackend(policy_for({1: (2, True), 2: (3, True)}, tenant, task))  # base answers 1 in 3 right

    g1 = run_gate(cfg, tenant, task, rvs[1], backend=backend, gate=gate, training_prompts=[])
    assert g1.decision.outcome == "promote", g1.decision.reasons
    (r1,) = reconcile(cfg, [(tenant, task)], who="gateway reconcile", gateway=inside).targets
    assert r1.outcome == "swapped" and r1.swap["why"].startswith(f"promoted by gate run {g1.run_id}: ")

    g2 = run_gate(cfg, tenant, task, rvs[2], backend=backend, gate=gate, training_prompts=[])
    assert g2.decision.outcome == "promote", g2.decision.reasons
    monkeypatch.setattr("pipelines.deploy.service.read_gateway_state",
                        lambda cfg: SimpleNamespace(url="http://gw", pid=1))
    monkeypatch.setattr("pipelines.deploy.service.swap",  # the gateway's /internal/swap: who, never why
                        lambda cfg, tenant, task, version, who: deployer.promote(tenant, task, version, who))
    (r2,) = reconcile(cfg, [(tenant, task)], who="dagster run 1234").targets
    assert r2.outcome == "swapped" and loads == [f"{tenant}/{task}/v1", f"{tenant}/{task}/v2"]

    assert operations.deploy(cfg, tenant, task, 1, "alice", "v2 answers too long").ok

    capsys.readouterr()
    assert main(["--config", str(toml), "swaps", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["who"], r["from"], r["to"]) for r in rows] == [
        ("gateway reconcile", None, "v1"), ("dagster run 1234", "v1", "v2"), ("alice", "v2", "v1")]
    for row, g in ((rows[0], g1), (rows[1], g2)):  # the gate's run, and its decision's figures
        assert row["why"].startswith(f"promoted by gate run {g.run_id}: primary suite 'answers' (n=30, bootstrap): "
                                     f"gain +0.3333 (champion ")
        assert re.search(r"p_gain=[0-9.]+ < alpha=0\.0500$", row["why"]) and row["why"] in f"promoted by gate run " \
            f"{g.run_id}: {g.decision.reasons[0]}"
    assert rows[2]["why"] == "deploy by alice: v2 answers too long"
    assert main(["--config", str(toml), "swaps"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 4 and all(" -  " not in line and not line.endswith(" -") for line in table[1:])  # none empty
    assert "dagster run 1234" in table[2] and f"promoted by gate run {g2.run_id}" in table[2]
