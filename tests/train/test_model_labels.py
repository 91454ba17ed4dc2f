"""The learner trains on turns nobody labelled once the reward model labels them (learner.reward_model):
a probe fitted on the target's voted turns, scored on held-out votes, labels the unlabelled turns it
is confident about, the learner trains on them with that confidence as weight and records how many
came from where. Off (the default), an unlabelled turn never trains.

Real lake, real reward engine, the tiny Llama's hidden states, real MLflow (sqlite)."""

from __future__ import annotations

import random
from datetime import timedelta

import duckdb
import pytest

from pipelines.config import TracerlConfig
from pipelines.config.train import OptimizerSettings, TrainConfig
from pipelines.contract.events import Message, ModelTurn
from pipelines.lake.ledger import ledger_source
from pipelines.models.registry import resolve_base_model
from pipelines.models.tiny import make_tiny_llama
from pipelines.reward.engine import run_rewards
from pipelines.train.labels import model_labelled
from pipelines.train.run import new_training_turns, run_learner
from tests.reward.reward_lake import ENV, at, fb, land, now

TENANT, TASK = ENV["tenant"], ENV["task"]
MARK = " 42 42 42"  # what these users like, whatever else the reply says
WORDS = "the cat sat on a mat and the dog ran to the park with a ball".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny", seed=0, warmup_steps=0)


def _config(home, tiny) -> TracerlConfig:
    cfg = TracerlConfig(home=home)
    cfg.gate.suites_dir = str(home / "evals")
    cfg.train = TrainConfig(base_model=str(tiny), seed=0,
                            optimizer=OptimizerSettings(lr=1e-3, steps_per_iteration=1, micro_batch_size=8))
    cfg.learner.min_new_turns, cfg.learner.max_turns = 4, 64
    return cfg


def _land(cfg: TracerlConfig, vote) -> None:
    """56 turns, half of them with the mark; the first 32 voted `vote(marked)`, the rest unlabelled."""
    rng, events = random.Random(0), []
    for i in range(56):
        marked, voted = i % 2 == 0, i < 32
        tid, trace = f"t{i}", f"tr-{i}"
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10))) + (MARK if marked else "")
        events.append(ModelTurn(**{**ENV, "trace_id": trace}, turn_id=tid, turn_index=0, event_time=at(i), model="m",
                                input_messages=[Message(role="user", content=f"tell me something ({i})")],
                                output_text=text))
        if voted:
            events.append(fb(tid, "thumbs", t=i + 1, value=vote(marked), trace_id=trace))
    land(cfg.lake, events)
    run_rewards(cfg.lake, now=now(0) + timedelta(days=2))


@pytest.fixture
def cfg(tmp_path, tiny) -> TracerlConfig:
    cfg = _config(tmp_path / "home", tiny)
    _land(cfg, lambda marked: 1 if marked else -1)
    return cfg


def _trained(cfg) -> set[str]:
    con = duckdb.connect()
    return {r[0] for r in con.execute(f"SELECT turn_id FROM {ledger_source(con, cfg.table_store)} "
                                      f"WHERE adapter_version > 0").fetchall()}


def test_the_reward_model_labels_the_unlabelled_turns_it_is_sure_of_and_the_learner_records_it(cfg):
    unlabelled = new_training_turns(cfg, TENANT, TASK, limit=100, labelled=False)
    assert len(unlabelled) == 24 and len(new_training_turns(cfg, TENANT, TASK, limit=100)) == 32
    cfg.learner.reward_model, cfg.learner.reward_model_labels = True, "both"
    base = resolve_base_model(cfg.train.base_model, cfg.home)
    turns, report = model_labelled(cfg, TENANT, TASK, base, unlabelled)
    assert report.usable and report.auroc >= 0.65 and report.n_holdout > 0, report
    assert len(turns) >= 12  # most of them, confidently
    assert all(t.reward == (1.0 if t.output_text.endswith(MARK) else -1.0) for t in turns)  # the right sign
    assert all(0 < t.weight <= 1 for t in turns)
    cfg.learner.reward_model_labels = "liked"  # the default: the model adds only the class real labels lack
    liked, _ = model_labelled(cfg, TENANT, TASK, base, unlabelled)
    assert liked == [t for t in turns if t.reward > 0] and liked
    cfg.learner.reward_model_labels = "both"

    r = run_learner(cfg, TENANT, TASK)
    assert r.status == "trained"
    assert r.metrics["labelled_turns"] == 32 and r.metrics["model_labelled_turns"] == len(turns)
    assert r.metrics["reward_model.usable"] == 1.0 and r.metrics["reward_model.auroc"] >= 0.65
    assert r.new_turns == 32 + len(turns)
    # the records: every new turn by where its label came from, and the share of the new traffic
    assert {k: v for k, v in r.metrics.items() if k.startswith("turns.")} == {
        "turns.explicit": 32, "turns.implicit": 0, "turns.hindsight": 0, "turns.model": len(turns), "turns.judge": 0}
    assert r.metrics["coverage"] == pytest.approx((32 + len(turns)) / 56, abs=1e-4)
    assert {t.turn_id for t in turns} <= _trained(cfg)


def test_off_by_default_an_unlabelled_turn_never_trains(cfg):
    r = run_learner(cfg, TENANT, TASK)
    assert r.status == "trained" and r.metrics["model_labelled_turns"] == 0 and r.new_turns == 32
    assert "reward_model.reason" not in r.metrics and r.metrics["coverage"] == pytest.approx(32 / 56, abs=1e-4)
    assert not any(t.startswith("t") and int(t[1:]) >= 32 for t in _trained(cfg))


def test_a_model_that_cannot_be_fitted_labels_nothing_and_says_why(tmp_path, tiny):
    """Every vote so far disliked: no positives yet. The iteration still trains on its labelled turns."""
    cfg = _config(tmp_path / "home", tiny)
    _land(cfg, lambda marked: -1)
    cfg.learner.reward_model = True
    r = run_learner(cfg, TENANT, TASK)
    assert r.status == "trained" and r.metrics["model_labelled_turns"] == 0 and r.new_turns == 32
    assert r.metrics["reward_model.usable"] == 0.0 and "nothing to learn from yet" in r.metrics["reward_model.reason"]


def test_silent_turns_fit_the_reward_model_only_when_asked_and_are_counted_apart(cfg):
    cfg.learner.reward_model, cfg.learner.reward_model_silence_weight = True, 0.05
    r = run_learner(cfg, TENANT, TASK)
    assert r.metrics["reward_model.silent_turns"] == 24 and r.metrics["reward_model.positives"] == 16


def test_a_rubric_judge_labels_what_the_reward_model_left_and_the_learner_records_it(cfg):
    """The judge is the loopback one of tests/reward/test_judge.py whose verdicts follow the voters:
    with the reward model off it labels all 24 unvoted turns, each with the right sign."""
    from pipelines.config.judge import JudgeConfig
    from tests.reward.test_judge import Judge

    server = Judge("follows")
    try:
        cfg.judge = JudgeConfig(rubric="A good reply ends with 42, three times.", url=server.url, model="judge")
        r = run_learner(cfg, TENANT, TASK)
    finally:
        server.close()
    assert r.status == "trained" and r.metrics["judge.usable"] == 1.0 and r.metrics["judge.auroc"] == 1.0
    assert r.metrics["turns.judge"] == 24 and r.metrics["turns.model"] == 0 and r.new_turns == 56
    assert r.metrics["coverage"] == pytest.approx(1.0) and "judge.reason" in r.metrics
    assert {f"t{i}" for i in range(32, 56)} <= _trained(cfg)


def test_a_turns_features_are_computed_once_and_the_learner_times_its_stages(cfg, monkeypatch, capsys):
    """The second iteration on the same lake reads every turn's features from the cache: no forward,
    no base model loaded, the same labels. The learner's result splits its wall time by stage."""
    import pipelines.reward.model as reward_model
    from pipelines.train.feature_cache import FeatureCache, cache_path

    pooled, calls = reward_model._pooled, []
    monkeypatch.setattr(reward_model, "_pooled", lambda model, tok, texts, *a: calls.append(len(texts)) or
                        pooled(model, tok, texts, *a))
    cfg.learner.reward_model, cfg.learner.reward_model_labels = True, "both"
    cfg.learner.reward_model_silence_weight = 0.05  # the silent turns are the unlabelled ones: computed once too
    base = resolve_base_model(cfg.train.base_model, cfg.home)
    unlabelled = new_training_turns(cfg, TENANT, TASK, limit=100, labelled=False)
    first, report = model_labelled(cfg, TENANT, TASK, base, unlabelled)
    assert report.usable and first and sum(calls) == 2 * 56  # conversation and reply, each turn once
    cache = FeatureCache(cache_path(cfg))
    assert len(cache.get(TENANT, TASK, _hash(base), 1, [f"t{i}" for i in range(56)])) == 56
    cache.close()

    calls.clear()
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained",
                        lambda *a, **k: pytest.fail("the base model was loaded with every feature cached"))
    again, report2 = model_labelled(cfg, TENANT, TASK, base, unlabelled)
    assert calls == [] and again == first and report2.auroc == report.auroc
    monkeypatch.undo()

    r = run_learner(cfg, TENANT, TASK)
    stages = {k for k in r.metrics if k.startswith("seconds.")}
    assert stages == {f"seconds.{s}" for s in ("select", "reward_model", "train_step", "predicted_gain", "publish",
                                               "record", "total")}
    assert all(isinstance(r.metrics[s], float) and r.metrics[s] >= 0 for s in stages)
    assert f"learner {TENANT}/{TASK} stages: select " in capsys.readouterr().out


def _hash(base) -> str:
    from pipelines.models.registry import base_model_hash

    return base_model_hash(base)
