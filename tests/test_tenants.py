"""`tracerl tenant add / list / revoke` without a running stack, and what the gate says about the
suite it scaffolds (real MLflow store, SQLite under the test's home). The live path (a running
gateway picks up the key, serves the champion, drops a deleted key) is
tests/deploy/test_tenant_live.py."""

from __future__ import annotations

import json
import re
import stat

import pytest

from tracerl.cli import main
from pipelines.config import load_config

PLACEHOLDER_RULE = "the gate will refuse to promote on the template's placeholder items until they are replaced"


@pytest.fixture
def conf(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # earlier tests may export theirs
    path = tmp_path / "tracerl.toml"
    path.write_text(f'home = "{tmp_path / "home"}"\n[gate]\nsuites_dir = "{tmp_path / "evals"}"\n')
    return path


def tracerl(conf, capsys, *argv) -> tuple[int, str, str]:
    rc = main(["--config", str(conf), *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_add_makes_a_key_shown_once_and_a_placeholder_suite_and_list_shows_them(conf, capsys, tmp_path):
    rc, out, _ = tracerl(conf, capsys, "tenant", "add", "newco", "--task", "support", "--task", "billing")
    assert rc == 0
    key = re.search(r"^  ([0-9a-f]{48})$", out, re.M).group(1)
    key_file = tmp_path / "home" / "gateway" / "keys" / "newco.key"
    assert key_file.read_text() == key and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    for task in ("support", "billing"):
        folder = tmp_path / "evals" / "newco" / task
        assert {p.name for p in folder.iterdir()} == {"quality.toml", "quality.jsonl"}
        items = [json.loads(line) for line in (folder / "quality.jsonl").read_text().splitlines()]
        assert items and all(i["placeholder"] is True for i in items)
        assert f"newco/{task}: eval suite scaffolded in {folder}/" in out
    assert out.count(PLACEHOLDER_RULE) == 2
    assert "the gateway is not running" in out and "`tracerl tenant serve newco`" in out

    rc, out, _ = tracerl(conf, capsys, "tenant", "list")
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["TENANT", "TASK", "CHAMPION", "SERVING", "KEY", "EVAL", "SUITE"]
    assert ["newco", "billing", "-", "-", "file", "3", "items", "(3", "placeholders)"] in rows
    assert ["newco", "support", "-", "-", "file", "3", "items", "(3", "placeholders)"] in rows

    # a new task of the same tenant keeps its key; the key is never printed again
    rc, out, _ = tracerl(conf, capsys, "tenant", "add", "newco", "--task", "faq")
    assert rc == 0 and key not in out and "key unchanged" in out
    assert key_file.read_text() == key

    # revoked: the file is gone, list says so
    rc, out, _ = tracerl(conf, capsys, "tenant", "revoke", "newco")
    assert rc == 0 and not key_file.exists()
    rc, out, _ = tracerl(conf, capsys, "tenant", "list")
    assert ["newco", "faq", "-", "-", "none", "3", "items", "(3", "placeholders)"] in [l.split() for l in out.splitlines()]


@pytest.mark.parametrize("argv,needle", [
    (["tenant", "add", "bad/name", "--task", "x"], "tenant='bad/name' is not a safe id"),
    (["tenant", "add", "ok", "--task", ".."], "task='..' is not a safe id"),
    (["tenant", "add", "x" * 65, "--task", "t"], "longer than the 64 characters"),
    (["tenant", "revoke", "nobody"], "has no key file"),
    (["tenant", "serve", "nobody"], "has no task"),
])
def test_bad_names_and_missing_things_are_clear_errors(conf, capsys, tmp_path, argv, needle):
    rc, out, err = tracerl(conf, capsys, *argv)
    assert rc == 1 and needle in err, err
    assert not (tmp_path / "home" / "gateway" / "keys").exists() and not (tmp_path / "evals").exists()


def test_a_task_the_tenant_serves_is_refused_and_nothing_changes(conf, capsys, tmp_path):
    assert tracerl(conf, capsys, "tenant", "add", "acme", "--task", "support")[0] == 0
    suite = tmp_path / "evals" / "acme" / "support" / "quality.jsonl"
    suite.write_text('{"messages": [{"role": "user", "content": "mine"}]}\n')
    (tmp_path / "home" / "adapters" / "acme" / "support" / "v1").mkdir(parents=True)  # it has adapters now
    rc, _, err = tracerl(conf, capsys, "tenant", "add", "acme", "--task", "new", "--task", "support")
    assert rc == 1 and "tenant 'acme' already has task(s) ['support']" in err and "nothing was changed" in err
    assert suite.read_text() == '{"messages": [{"role": "user", "content": "mine"}]}\n'
    assert not (tmp_path / "evals" / "acme" / "new").exists()


def _write_suite(folder, n):
    folder.mkdir(parents=True)
    (folder / "mine.toml").write_text('role = "primary"\nitems = "mine.jsonl"\n[scorer]\nkind = "similarity"\n')
    (folder / "mine.jsonl").write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Q{i}?"}],
                                                           "reference": f"A{i}."}) + "\n" for i in range(n)))


def test_add_adopts_an_eval_suite_written_first(conf, capsys, tmp_path):
    """The eval before the tenant (docs/guides.md): `tenant add` keeps that suite as it is (no
    template merged in) and scaffolds the other tasks; the key is made as for any new tenant."""
    mine = tmp_path / "evals" / "newco" / "support"
    _write_suite(mine, 4)
    before = {p.name: p.read_text() for p in mine.iterdir()}
    rc, out, err = tracerl(conf, capsys, "tenant", "add", "newco", "--task", "support", "--task", "billing")
    assert rc == 0, err
    assert {p.name: p.read_text() for p in mine.iterdir()} == before  # adopted untouched
    assert f"newco/support: eval suite already written (4 items in {mine}/): adopted as it is" in out
    assert f"newco/billing: eval suite scaffolded in {tmp_path / 'evals' / 'newco' / 'billing'}/" in out
    assert out.count(PLACEHOLDER_RULE) == 1  # only the scaffold's
    assert (tmp_path / "home" / "gateway" / "keys" / "newco.key").is_file()
    rc, out, _ = tracerl(conf, capsys, "tenant", "list")
    rows = [line.split() for line in out.splitlines()]
    assert ["newco", "support", "-", "-", "file", "4", "items"] in rows
    assert ["newco", "billing", "-", "-", "file", "3", "items", "(3", "placeholders)"] in rows
    # added again: both suites adopted, nothing scaffolded, the key unchanged
    rc, out, _ = tracerl(conf, capsys, "tenant", "add", "newco", "--task", "support", "--task", "billing")
    assert rc == 0 and "scaffolded" not in out and out.count("adopted as it is") == 2 and "key unchanged" in out


@pytest.mark.parametrize("content,needle", [
    ({}, "exists but holds no suite (*.toml)"),
    ({"bad.toml": 'role = "boss"\n[scorer]\nkind = "regex"\n'}, "holds an eval suite that does not load"),
])
def test_a_suite_folder_that_is_no_suite_is_refused_and_nothing_changes(conf, capsys, tmp_path, content, needle):
    folder = tmp_path / "evals" / "newco" / "support"
    folder.mkdir(parents=True)
    for name, text in content.items():
        (folder / name).write_text(text)
    rc, _, err = tracerl(conf, capsys, "tenant", "add", "newco", "--task", "billing", "--task", "support")
    assert rc == 1 and needle in err and "nothing was changed" in err, err
    assert sorted(p.name for p in folder.iterdir()) == sorted(content)
    assert not (tmp_path / "evals" / "newco" / "billing").exists()
    assert not (tmp_path / "home" / "gateway" / "keys").exists()


def test_a_fresh_home_lists_no_tenant(conf, capsys, tmp_path):
    rc, out, _ = tracerl(conf, capsys, "tenant", "list")
    assert rc == 0 and out == "no tenants (add one: tracerl tenant add NAME --task TASK)\n"
    _write_suite(tmp_path / "evals" / "_template", 1)  # the scaffold is not a tenant
    assert tracerl(conf, capsys, "tenant", "list")[1].startswith("no tenants")


@pytest.mark.slow
def test_the_gate_says_placeholder_for_the_scaffold_and_how_to_scaffold_for_nothing(conf, capsys, tmp_path):
    from pipelines.gate.run import run_gate
    from pipelines.evals.suites import load_suites, suite_problem
    from tests.gate.gate_fixtures import candidate

    assert tracerl(conf, capsys, "tenant", "add", "newco", "--task", "support", "--no-serve")[0] == 0
    cfg = load_config(conf)
    rv, _ = candidate(cfg, "newco", "support")
    r = run_gate(cfg, "newco", "support", rv, training_prompts=[])
    [reason] = r.decision.reasons
    assert r.decision.outcome == "reject" and reason.startswith("placeholder eval items in ")
    assert PLACEHOLDER_RULE in reason and "3 of 3 items" in reason

    rv, _ = candidate(cfg, "newco", "nosuite")
    [reason] = run_gate(cfg, "newco", "nosuite", rv, training_prompts=[]).decision.reasons
    assert reason.startswith("no eval suites under ") and "`tracerl tenant add newco --task nosuite`" in reason
    assert PLACEHOLDER_RULE in reason

    # replaced by real items: nothing left to refuse (the gate then evaluates them)
    items = tmp_path / "evals" / "newco" / "support" / "quality.jsonl"
    items.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Real question {i}?"}],
                                         "reference": f"Answer {i}."}) + "\n" for i in range(5)))
    assert suite_problem(cfg.gate.suites_dir, "newco", "support", load_suites(cfg.gate.suites_dir, "newco", "support")) is None
    rc, out, _ = tracerl(conf, capsys, "tenant", "list")
    assert ["newco", "support", "-", "-", "file", "5", "items"] in [l.split() for l in out.splitlines()]
