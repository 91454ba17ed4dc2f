"""Per-target settings reach the stages: `[targets."acme/concise".train.optimizer] lr` trains
acme/concise with that rate while acme/other keeps the global one (MLflow params and adapter
meta), and a target's `[targets."..".gate]` entry decides its candidates.

Real lake, real reward engine, real MLflow store under the test's home, the tiny Llama.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from pipelines.config import TracerlConfig, load_config
from pipelines.gate.run import run_gate
from pipelines.models.tiny import make_tiny_llama
from pipelines.reward.engine import run_rewards
from pipelines.tracking import client
from pipelines.adapters.store import AdapterStore
from pipelines.train.run import run_learner
from tests.gate.gate_fixtures import candidate
from tests.reward.reward_lake import fb, land, now, turn

TARGET_LR, GLOBAL_LR = 2e-3, 1e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny", seed=0, warmup_steps=0)


@pytest.mark.slow
def test_a_target_trains_with_its_own_settings(tmp_path, tiny, monkeypatch):
    monkeypatch.delenv("TRACERL_HOME", raising=False)
    toml = tmp_path / "tracerl.toml"
    toml.write_text(f'''home = "{tmp_path / 'home'}"
[learner]
min_new_turns = 4
max_turns = 8
[train]
base_model = "{tiny}"
[train.optimizer]
lr = {GLOBAL_LR}
steps_per_iteration = 1
[gate]
suites_dir = "{tmp_path / 'evals'}"
[targets."acme/concise".train.optimizer]
lr = {TARGET_LR}
[targets."acme".learner]
min_new_turns = 2
''')
    cfg = load_config(toml)
    events = []
    for task in ("concise", "other"):
        for i, thumb in enumerate((1, -1, 1, -1)):
            tid = f"{task}-{i}"
            events += [turn(tid, 0, i, task=task, text="Sure." if thumb > 0 else "No."),
                       fb(tid, "thumbs", t=i + 1, value=thumb, task=task)]
    land(cfg.lake, events)
    run_rewards(cfg.lake, now=now(0) + timedelta(days=2))

    store, mlflow = AdapterStore(cfg.adapter_root), client(cfg)
    lrs = {}
    for task in ("concise", "other"):
        r = run_learner(cfg, "acme", task)
        assert r.status == "trained", r.reason
        meta = store.get("acme", task, r.adapter_version).meta
        params = mlflow.get_run(r.mlflow_run_id).data.params
        assert float(params["train.optimizer.lr"]) == meta["config"]["optimizer"]["lr"]
        assert params["learner.min_new_turns"] == "2"  # the tenant-wide entry applies to both tasks
        lrs[task] = meta["config"]["optimizer"]["lr"]
    assert lrs == {"concise": TARGET_LR, "other": GLOBAL_LR}
    assert cfg.train.optimizer.lr == GLOBAL_LR  # the global settings are untouched


def test_a_target_is_gated_with_its_own_settings(tmp_path):
    """No eval suites anywhere: by default a candidate is rejected; the target that turned
    fail_on_missing_suites off gets its candidate promoted."""
    cfg = TracerlConfig(home=tmp_path / "home", targets={"acme/lenient": {"gate": {"fail_on_missing_suites": False}}})
    cfg.gate.suites_dir = str(tmp_path / "evals")
    outcomes = {}
    for task in ("lenient", "strict"):
        rv, _ = candidate(cfg, "acme", task)
        outcomes[task] = run_gate(cfg, "acme", task, rv).decision.outcome
    assert outcomes == {"lenient": "promote", "strict": "reject"}
