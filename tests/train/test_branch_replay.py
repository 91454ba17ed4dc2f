"""The learner remembers: a rejected candidate's child trains from it (adapter, AdamW state,
baselines), resets to the champion under the configured conditions, and settled turns of earlier
iterations replay with decaying weight until their use budget is spent; eval prompts never do.

Real lake (events landed as ingest would), real reward engine, real MLflow registry (sqlite under
the test's home), the tiny Llama; the gate's verdicts are written with the gate's own registry calls.
"""

from __future__ import annotations

import json
from datetime import timedelta

import duckdb
import pytest

from pipelines.adapters import registry
from pipelines.config import TracerlConfig
from pipelines.contract.events import Message, ModelTurn
from pipelines.adapters import promote as gate_reg
from pipelines.models.tiny import make_tiny_llama
from pipelines.reward.engine import run_rewards
from pipelines.tracking import client
from pipelines.adapters.store import AdapterStore
from pipelines.train.batch import TrainTurn
from pipelines.config.train import OptimizerSettings, TrainConfig
from pipelines.train.optim_state import OPTIMIZER_FILE
from pipelines.train.replay import ReplayTurn, max_replay_age, prioritize, replay_weight
from pipelines.lake.tables import LEDGER_SCHEMA
from pipelines.lake.ledger import TRAINED_TURNS, ledger_source
from pipelines.train.run import run_learner
from tests.reward.reward_lake import ENV, at, fb, land, now

TENANT, TASK = ENV["tenant"], ENV["task"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny", seed=0, warmup_steps=0)


@pytest.fixture
def lcfg(tmp_path, tiny) -> TracerlConfig:
    cfg = TracerlConfig(home=tmp_path / "home")
    cfg.gate.suites_dir = str(tmp_path / "evals")  # no suites unless a test writes one
    cfg.train = TrainConfig(base_model=str(tiny), seed=0,
                            optimizer=OptimizerSettings(lr=1e-3, steps_per_iteration=1, micro_batch_size=8))
    cfg.learner.min_new_turns, cfg.learner.max_turns = 4, 8
    return cfg


class Traffic:
    """Each call lands a new window of 4 settled, thumbed turns: 2 prompts x 2 samples, one liked
    and one disliked per prompt (every group carries signal), later in event time than the last."""

    def __init__(self, cfg: TracerlConfig):
        self.cfg, self.window = cfg, 0

    def __call__(self, prompts: list[str] | None = None) -> list[str]:
        w, self.window = self.window, self.window + 1
        prompts = prompts or [f"question {w}.{k}" for k in range(2)]
        events, ids = [], []
        for k, prompt in enumerate(prompts):
            for s, thumb in enumerate((1, -1)):
                tid = f"w{w}-p{k}-s{s}"
                t = w * 1000 + k * 10 + s
                events.append(ModelTurn(**ENV, turn_id=tid, turn_index=0, event_time=at(t), model="m",
                                        input_messages=[Message(role="user", content=prompt)],
                                        output_text=("Sure, done." if thumb > 0 else "No.")))
                events.append(fb(tid, "thumbs", t=t + 1, value=thumb))
                ids.append(tid)
        land(self.cfg.lake, events)
        run_rewards(self.cfg.lake, now=now(w * 1000) + timedelta(days=2))
        return ids


def _optimizer_step(path) -> float:
    from safetensors import safe_open

    with safe_open(str(path / OPTIMIZER_FILE), framework="pt") as fh:
        return max(float(fh.get_tensor(k)) for k in fh.keys() if k.endswith(".step"))


def _reject(cfg, r) -> None:
    gate_reg.set_tags(cfg, TENANT, TASK, r.registry_version, {gate_reg.DECISION: "reject"})
    gate_reg.mark_rejected(cfg, TENANT, TASK, r.registry_version)


def _ledger(cfg) -> list[tuple]:
    con = duckdb.connect()
    return con.execute(f"SELECT turn_id, adapter_version, use, weight FROM {ledger_source(con, cfg.table_store)} "
                       f"ORDER BY adapter_version, turn_id").fetchall()


@pytest.mark.slow
def duckdb_count(cfg, sql: str, *params) -> int:
    from pipelines.lake.query import connect

    return connect(cfg.lake).execute(sql, list(params)).fetchone()[0]


def test_rejected_candidates_grow_a_branch_and_a_promotion_starts_a_new_one(lcfg):
    cfg, traffic, store = lcfg, Traffic(lcfg), AdapterStore(lcfg.adapter_root)
    cfg.learner.replay_turns = 0  # the branch alone
    traffic()
    r1 = run_learner(cfg, TENANT, TASK)
    assert (r1.status, r1.parent_version, r1.branch_depth, r1.branch_base) == ("trained", None, 1, None)
    v1 = store.get(TENANT, TASK, r1.adapter_version)
    assert (v1.path / OPTIMIZER_FILE).is_file() and _optimizer_step(v1.path) == 1.0
    assert v1.meta["branch"] == {"base": None, "depth": 1, "parent": None, "reset_reason": None}
    _reject(cfg, r1)

    traffic()
    r2 = run_learner(cfg, TENANT, TASK)
    v2 = store.get(TENANT, TASK, r2.adapter_version)
    assert r2.parent_version == r1.adapter_version and r2.branch_depth == 2 and r2.reset_reason is None
    assert v2.meta["branch"] == {"base": None, "depth": 2, "parent": r1.adapter_version, "reset_reason": None}
    assert v2.meta["parent_version"] == r1.adapter_version
    # AdamW continued: the saved step count goes on from the parent's, and the meta says from where
    assert _optimizer_step(v2.path) == 2.0
    assert v2.meta["optimizer"] == {"resumed_from": r1.adapter_version, "resumed_step": 1.0}
    assert set(v2.meta["task_baselines"]) == {TASK}  # the running baselines travel with the branch
    run_tags = client(cfg).get_run(r2.mlflow_run_id).data.tags
    mv_tags = client(cfg).get_model_version(registry.model_name(TENANT, TASK), r2.registry_version).tags
    for tags in (run_tags, mv_tags):
        assert (tags["tracerl.branch.base"], tags["tracerl.branch.depth"], tags["tracerl.branch.parent"],
                tags["tracerl.branch.reset_reason"]) == ("base", "2", str(r1.adapter_version), "none")
    # the gate's lineage (contamination check) now walks the branch
    assert [v.version for v in store.lineage(TENANT, TASK, r2.adapter_version)] == [2, 1]
    # what a reviewer reads: the run named with its version, its window as a dataset input, and the
    # version's description naming parent, data and run (the run's timing: tests/test_tracking_env.py)
    run = client(cfg).get_run(r2.mlflow_run_id)
    assert run.info.run_name == f"learner {TENANT}/{TASK} v2"
    [ds] = run.inputs.dataset_inputs
    ds_tags = {t.key: t.value for t in ds.tags}
    assert ds.dataset.name == f"lake {TENANT}/{TASK}" and ds.dataset.source.endswith("/events\"}")
    assert ds_tags["mlflow.data.context"] == "training" and int(ds_tags["turns"]) == r2.new_turns
    assert ds_tags["reward_spec_version"] == run_tags["reward_spec_version"]
    # the scheduled path's reward plot: every serving version's settled reward, as a PNG and metrics
    assert "learner/live_reward_by_version.png" in {a.path for a in client(cfg).list_artifacts(run.info.run_id,
                                                                                                "learner")}
    from pipelines.train.plots import reward_history

    points = reward_history(cfg, TENANT, TASK)
    settled = duckdb_count(cfg, "SELECT count(DISTINCT turn_id) FROM rewards WHERE settled AND labelled AND tenant = ?",
                           TENANT)
    assert points and sum(p.turns for p in points) == settled
    history = client(cfg).get_metric_history(run.info.run_id, "live_reward_by_version")
    assert [(m.step, round(m.value, 6)) for m in history] == [(p.version, round(p.mean, 6)) for p in points]
    desc = client(cfg).get_model_version(registry.model_name(TENANT, TASK), r2.registry_version).description
    assert desc.startswith(f"## Learner\n\nAdapter v2, trained from v{r1.adapter_version} by [its learner run]")
    assert f"on {r2.new_turns} new settled turns" in desc

    registry.set_alias(cfg, TENANT, TASK, registry.CHAMPION, r2.registry_version)  # the gate promotes v2
    traffic()
    r3 = run_learner(cfg, TENANT, TASK)
    v3 = store.get(TENANT, TASK, r3.adapter_version)
    assert (r3.parent_version, r3.branch_base, r3.branch_depth, r3.reset_reason) == (2, 2, 1, None)
    assert _optimizer_step(v3.path) == 1.0 and v3.meta["optimizer"]["resumed_from"] is None  # fresh AdamW

    gate_reg.promote(cfg, TENANT, TASK, r3.registry_version)  # v3 goes live, then is rolled back:
    gate_reg.rollback(cfg, TENANT, TASK)                       # v2 is champion again, v3 its head
    traffic()
    r4 = run_learner(cfg, TENANT, TASK)
    assert (r4.parent_version, r4.branch_base, r4.branch_depth) == (2, 2, 1)
    assert r4.reset_reason.startswith("rolled_back: v3")

    cfg.learner.branch = False  # old behaviour: from the champion every time, and the meta says why
    _reject(cfg, r4)
    traffic()
    r5 = run_learner(cfg, TENANT, TASK)
    assert (r5.parent_version, r5.branch_depth, r5.reset_reason) == (2, 1, "learner.branch = false")


@pytest.mark.slow
def test_kl_depth_and_contamination_reset_the_branch_to_the_champion(lcfg):
    cfg, traffic, store = lcfg, Traffic(lcfg), AdapterStore(lcfg.adapter_root)
    cfg.learner.replay_turns = 0
    # v1 is trained from a fresh LoRA (B = 0): its one step sees KL exactly 0; v2 starts from v1's
    # non-zero adapter, so its KL is > 0 and over this budget
    cfg.learner.branch_max_kl, cfg.learner.branch_max_depth = 1e-12, 3
    results = []
    for _ in range(6):
        traffic()
        results.append(r := run_learner(cfg, TENANT, TASK))
        _reject(cfg, r)
        if r.adapter_version == 4:  # the gate found eval items in v4's training data
            gate_reg.set_tags(cfg, TENANT, TASK, r.registry_version, {"tracerl.gate.contamination": "ab12"})
    kl = [store.get(TENANT, TASK, r.adapter_version).meta["metrics"]["kl"] for r in results]
    assert kl[0] == 0.0 and kl[1] > cfg.learner.branch_max_kl
    assert [(r.parent_version, r.branch_depth) for r in results] == [
        (None, 1), (1, 2), (None, 1), (3, 2), (None, 1), (5, 2)]
    reasons = [r.reset_reason for r in results]
    assert reasons[0] is None and reasons[1] is None and reasons[3] is None and reasons[5] is None
    assert reasons[2].startswith("kl: v2 last-step KL") and "learner.branch_max_kl=1e-12" in reasons[2]
    assert reasons[4].startswith("contamination: v4")
    assert store.get(TENANT, TASK, 3).meta["branch"]["reset_reason"] == reasons[2]
    assert client(cfg).get_run(results[2].mlflow_run_id).data.tags["tracerl.branch.reset_reason"] == reasons[2]
    assert _optimizer_step(store.get(TENANT, TASK, 3).path) == 1.0  # a reset starts a fresh AdamW

    cfg.learner.branch_max_kl = 1e9  # depth alone: v5, v6, v7 are depths 1..3 of one branch, v8 resets
    for _ in range(4):
        traffic()
        results.append(r := run_learner(cfg, TENANT, TASK))
        _reject(cfg, r)
    assert [(r.parent_version, r.branch_depth) for r in results[6:]] == [(6, 3), (None, 1), (8, 2), (9, 3)]
    assert results[7].reset_reason.startswith("depth: v7 is candidate 3 of its branch")


@pytest.mark.slow
def test_replayed_turns_train_again_with_decaying_weight_until_their_uses_are_spent(lcfg):
    cfg, traffic = lcfg, Traffic(lcfg)
    cfg.learner.replay_max_uses, cfg.learner.replay_half_life, cfg.learner.replay_min_weight = 3, 2.0, 0.1
    first = traffic()
    r1 = run_learner(cfg, TENANT, TASK)
    assert r1.replayed_turns == 0 and r1.new_turns == 4
    traffic()
    r2 = run_learner(cfg, TENANT, TASK)
    assert r2.new_turns == 4 and r2.replayed_turns == 4  # the first window, once more
    assert r2.metrics["replay.uses_max"] == 2.0 and r2.metrics["replay.weight_mean"] == pytest.approx(0.5 ** 0.5)
    # the replayed turns' reference logprobs were kept by their first use: read, not recomputed
    assert (r1.metrics["reference_read"], r2.metrics["reference_read"]) == (0, 4)
    traffic()
    r3 = run_learner(cfg, TENANT, TASK)
    assert r3.replayed_turns == 8 and r3.metrics["replay.uses_max"] == 3.0
    traffic()
    r4 = run_learner(cfg, TENANT, TASK)
    rows = _ledger(cfg)
    uses = {tid: [(v, u, w) for t, v, u, w in rows if t == tid] for tid in first}
    for tid in first:  # 1 -> 2 -> 3 uses, then the budget is spent: nothing in v4
        assert uses[tid] == [(1, 1, 1.0), (2, 2, pytest.approx(0.5 ** 0.5)), (3, 3, pytest.approx(0.5))]
    assert r4.replayed_turns == 8  # windows 2 and 3 (window 1 is spent)
    summary = client(cfg).download_artifacts(r4.mlflow_run_id, "summary.json", str(cfg.home))
    hist = json.loads(open(summary).read())["replay"]["uses_histogram"]
    assert hist == {"1": 4, "2": 4, "3": 4}
    history = client(cfg).get_metric_history(r4.mlflow_run_id, "replay.uses_mean")
    assert [m.value for m in history] == [2.5]
    # replay never triggers a run by itself
    r5 = run_learner(cfg, TENANT, TASK)
    assert r5.status == "skipped" and "min_new_turns" in r5.reason


@pytest.mark.slow
def test_old_turns_leave_the_pool_below_min_weight(lcfg):
    cfg, traffic = lcfg, Traffic(lcfg)
    cfg.learner.replay_max_uses, cfg.learner.replay_half_life, cfg.learner.replay_min_weight = 10, 1.0, 0.3
    first = set(traffic())
    for _ in range(3):
        run_learner(cfg, TENANT, TASK)
        traffic()
    ages = {}
    for tid, v, u, w in _ledger(cfg):
        if tid in first:
            ages[v] = w
    # ages 0, 1 (w .5), then w .25 < .3: out of the pool after two uses although uses remain
    assert ages == {1: 1.0, 2: pytest.approx(0.5)}, ages


def _write_suite(cfg: TracerlConfig, prompts: list[str]) -> None:
    from pathlib import Path

    folder = Path(cfg.gate.suites_dir) / TENANT / TASK
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "s.jsonl").write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}],
                                                        "reference": "x"}) + "\n" for p in prompts))
    (folder / "s.toml").write_text('name = "s"\nrole = "primary"\nitems = "s.jsonl"\n[scorer]\nkind = "exact"\n')


@pytest.mark.slow
def test_eval_prompts_are_never_replayed_even_when_the_suite_arrives_later(lcfg):
    cfg, traffic = lcfg, Traffic(lcfg)
    cfg.learner.min_new_turns = 2
    _write_suite(cfg, ["eval from the start"])
    ids = traffic(["eval from the start", "ordinary question"])
    r1 = run_learner(cfg, TENANT, TASK)
    assert r1.excluded_eval_turns == 2 and r1.new_turns == 2
    _write_suite(cfg, ["eval from the start", "ordinary question"])  # the team adds an item later
    traffic()
    r2 = run_learner(cfg, TENANT, TASK)
    assert r2.replayed_turns == 0 and r2.excluded_eval_turns == 2  # the trained pair leaves the pool
    import shutil

    shutil.rmtree(cfg.gate.suites_dir)  # even with the suite gone, the ledger's version-0 rows keep them out
    traffic()
    r3 = run_learner(cfg, TENANT, TASK)
    rows = _ledger(cfg)
    replays = {t for t, v, u, w in rows if u > 1}
    assert not replays & set(ids), replays
    assert r3.replayed_turns == 4  # window 2 replays normally


@pytest.mark.slow
def test_ledger_files_without_use_and_weight_columns_still_read(lcfg):
    """A ledger table an older release wrote, before `use` and `weight`: the new rows' commit adds
    the columns to its schema, and the old rows read them NULL."""
    import pyarrow as pa

    from pipelines.lake import delta
    from pipelines.train.replay import replay_pool

    cfg, traffic = lcfg, Traffic(lcfg)
    ids = traffic()
    old = pa.schema([f for f in LEDGER_SCHEMA if f.name not in ("use", "weight")] + [("tenant", pa.string())])
    delta.append(cfg.table_store, TRAINED_TURNS,
                 pa.table({"task": [TASK] * 4, "turn_id": ids, "adapter_version": [1] * 4,
                           "trained_at": [0] * 4, "tenant": [TENANT] * 4}, schema=old))
    pool = replay_pool(cfg, TENANT, TASK)
    assert sorted(p.turn.turn_id for p in pool) == sorted(ids) and {p.uses for p in pool} == {1}
    traffic()
    r = run_learner(cfg, TENANT, TASK)
    assert r.new_turns == 4 and r.replayed_turns == 4
    assert {u for t, v, u, w in _ledger(cfg) if t in ids} == {None, 2}


# -- pure parts ---------------------------------------------------------------------------------------

def _rt(tid: str, reward: float, t: int, uses: int = 1) -> ReplayTurn:
    return ReplayTurn(TrainTurn(tid, TASK, None, None, None, "", None, reward), uses, 1, t)


def test_priority_puts_rare_outcomes_first_then_newest():
    pool = [_rt("neg-old", -1.0, 1), _rt("neg-new", -1.0, 5), _rt("pos", 1.0, 2), _rt("neg-mid", -1.0, 3)]
    assert [p.turn.turn_id for p in prioritize(pool, 3)] == ["pos", "neg-new", "neg-mid"]
    assert prioritize(pool, 0) == [] and prioritize([], 5) == []


def test_weight_halves_every_half_life_and_the_age_cut_matches_min_weight():
    assert replay_weight(0, 2.0) == 1.0 and replay_weight(2, 2.0) == 0.5 and replay_weight(4, 2.0) == 0.25
    for half_life in (0.5, 1.0, 2.0, 3.0):
        for min_w in (0.1, 0.25, 0.5, 1.0):
            a = max_replay_age(half_life, min_w)
            assert replay_weight(a, half_life) >= min_w - 1e-12 and replay_weight(a + 1, half_life) < min_w


@pytest.mark.parametrize("bad", [dict(replay_max_uses=0), dict(replay_half_life=0.0), dict(replay_min_weight=0.0),
                                 dict(replay_min_weight=1.5), dict(branch_max_kl=0.0), dict(branch_max_depth=0),
                                 dict(replay_turns=-1)])
def test_learner_config_rejects_bad_values_naming_them(bad):
    from pipelines.config import LearnerConfig

    with pytest.raises(ValueError, match=f"learner.{next(iter(bad))}="):
        LearnerConfig(**bad)


def test_optimizer_state_of_another_shape_is_a_value_error(tmp_path):
    import torch

    from pipelines.train.optim_state import load_optimizer_state, save_optimizer_state

    def opt(shape):
        p = torch.nn.Parameter(torch.ones(shape))
        o = torch.optim.AdamW([p], lr=0.1)
        p.grad = torch.ones(shape)
        o.step()
        return o

    save_optimizer_state(opt((4, 2)), tmp_path / OPTIMIZER_FILE)
    same = opt((4, 2))
    assert load_optimizer_state(same, tmp_path / OPTIMIZER_FILE) == 1
    assert same.param_groups[0]["lr"] == 0.1
    with pytest.raises(ValueError, match="shape"):
        load_optimizer_state(opt((8, 2)), tmp_path / OPTIMIZER_FILE)


@pytest.mark.slow
def test_a_branch_adapter_with_its_optimizer_state_passes_the_deployer_and_serves_in_vllm(lcfg, tiny):
    """optimizer.safetensors sits in the adapter folder: no pickle for the deployer to refuse, and
    vLLM reads only adapter_model.safetensors from it."""
    from pipelines.deploy import admin
    from pipelines.deploy.deployer import validate_adapter
    from pipelines.deploy.vllm_server import start_vllm, stop_vllm
    from pipelines.models.registry import base_model_hash
    from tests.deploy.test_vllm import VLLM_PY

    if not VLLM_PY.is_file():
        pytest.skip(f"no {VLLM_PY}: run `make vllm-venv` to test against a live vLLM")
    cfg, traffic = lcfg, Traffic(lcfg)
    traffic()
    _reject(cfg, run_learner(cfg, TENANT, TASK))
    traffic()
    r = run_learner(cfg, TENANT, TASK)  # depth 2: loaded and re-saved the AdamW state
    store = AdapterStore(cfg.adapter_root)
    av = validate_adapter(store, TENANT, TASK, r.adapter_version, base_model_hash(tiny))
    assert (av.path / OPTIMIZER_FILE).is_file() and r.branch_depth == 2
    home = cfg.home / "vllm"
    state = start_vllm(tiny, home=home, port=None, max_loras=2, max_lora_rank=16, max_cpu_loras=2,
                       dtype="float32", python=".venv-vllm/bin/python", start_timeout_s=240)
    try:
        admin.load_adapter(state.base_url, av.name, av.path)
        out = admin.complete(state.base_url, av.name, prompt="question 0.0", max_tokens=4, seed=0)
        assert out.model == av.name and len(out.token_ids) >= 1
    finally:
        stop_vllm(home)
