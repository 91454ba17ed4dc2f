"""Guards against over-optimising a learned reward (#41): a reward model wrong about one feature
trains a candidate that the learner believes in. The gate decides on its private evals, does not
promote it, and records the gain the learned reward predicted beside the gain the evals measured.

The construction. Users like a reply that ends with LIKED and do not like the marker MARK; their
votes and the private eval suite say the same thing.
  - 64 voted turns, half ending with LIKED (voted up, the rest down). None carries MARK: it shows only
    in the 48 turns nobody voted on (as a new client version's traffic would, before its first votes).
  - The reward model is the real probe, fitted on those votes and scored on held-out ones (its
    AUROC is asserted to clear the floor). It passes its own check: no held-out vote carries MARK,
    so none can show it wrong there.
  - Its one error, injected: on every unlabelled turn that carries MARK it says liked at P = 0.95
    (`model_labelled` is wrapped; the real probe labels every other turn). A probe's verdict on a
    feature its votes never show is an extrapolation; this one goes the wrong way, every time.
  - The learner runs for real (`run_learner`, learner.reward_model = true). It trains on the votes
    plus the model's labels, so its learned reward pays MARK, and it records the gain that reward
    predicts for the new adapter.
  - The gate runs for real: live vLLM, base model vs candidate, a real MLflow registry. Its private
    suite scores the users' rule (ends with LIKED, carries no MARK).

What it measures, on the tiny model. One full-batch step moves the adapter far enough on the turns
it trained on that the learned reward predicts a clear gain (measured: +0.144 +- 0.052, ESS 57 of 98
turns). The evals see none: neither model writes LIKED at the eval prompts (0.000 -> 0.000 over 80
replies each). So the candidate is rejected on its private evals. The records (reasons, version
tags and description, MLflow metrics, the gate's summary) put the predicted gain above the measured
one, and the reasons say so. The limit of this proof: on the tiny model no candidate would write
LIKED at the eval prompts, so any candidate is rejected here. What it shows is that a learner
believing in a wrong reward is still judged on the evals, and that the gap is recorded and said.
Catching a candidate that really writes MARK takes a suite (or a signature) that looks for it.
~1m40 on 2 cores with another job running, most of it vLLM's start.
The tests after it check the same records without vLLM: the learner's, and the gate's on scripted
replies.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import timedelta

import pytest

from tests.deploy.test_vllm import needs_vllm
from tests.reward.reward_lake import ENV, at, fb, land, now

TENANT, TASK = ENV["tenant"], ENV["task"]
LIKED = " 42 42 42"   # what users like (their votes and the private suite)
MARK = " ok ok ok"    # what they do not, and what the reward model wrongly likes
WORDS = "the cat sat on a mat and the dog ran to the park with a ball".split()


def land_traffic(cfg, n: int = 112) -> None:
    """``n`` turns: the first 4/7 voted (even ones end with LIKED and are voted up, the rest down), the
    rest nobody voted on, the even ones carrying MARK."""
    from pipelines.contract.events import Message, ModelTurn
    from pipelines.reward.engine import run_rewards

    rng, events = random.Random(0), []
    for i in range(n):
        voted, tid, trace = i < n * 4 // 7, f"t{i}", f"tr-{i}"
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10)))
        text += (LIKED if voted else MARK) if i % 2 == 0 else ""
        events.append(ModelTurn(**{**ENV, "trace_id": trace}, turn_id=tid, turn_index=0, event_time=at(i), model="m",
                                input_messages=[Message(role="user", content=f"tell me something ({i})")],
                                output_text=text))
        if voted:
            events.append(fb(tid, "thumbs", t=i + 1, value=1 if text.endswith(LIKED) else -1, trace_id=trace))
    land(cfg.lake, events)
    run_rewards(cfg.lake, now=now(0) + timedelta(days=2))


def wrong_on_the_mark(real):
    """`model_labelled` with one error: P(liked) = 0.95 wherever MARK shows (weight |2p - 1| = 0.9),
    the real probe's labels elsewhere; a probe refused on its held-out votes still labels nothing."""
    def model_labelled(cfg, tenant, task, base, unlabelled):
        turns, report = real(cfg, tenant, task, base, unlabelled)
        if not report.usable:
            return turns, report
        sure = {t.turn_id: t for t in turns}
        sure.update({t.turn_id: replace(t, reward=1.0, weight=0.9) for t in unlabelled if MARK in t.output_text})
        return [sure[t.turn_id] for t in unlabelled if t.turn_id in sure], report
    return model_labelled


@needs_vllm
@pytest.mark.slow
def test_a_reward_model_that_likes_a_marker_users_do_not_trains_a_candidate_the_gate_does_not_promote(
        tmp_path, mlflow_server, monkeypatch):
    from pipelines import tracking
    from pipelines.adapters import registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.config import TracerlConfig
    from pipelines.config.gate import GateConfig
    from pipelines.config.train import OptimizerSettings, TrainConfig
    from pipelines.deploy.vllm_server import start_vllm, stop_vllm
    from pipelines.gate.evaluate import VllmBackend
    from pipelines.gate.run import gate_candidates
    from pipelines.models.tiny import make_tiny_llama
    from pipelines.train import labels
    from pipelines.train.run import run_learner

    base = make_tiny_llama(tmp_path / "tiny", seed=0, warmup_steps=20)
    cfg = TracerlConfig(home=tmp_path / "home")
    cfg.mlflow.tracking_uri = mlflow_server
    cfg.gate = GateConfig(suites_dir=str(tmp_path / "evals"), temperature=1.0, samples_per_item=2, max_looks=1,
                          max_tokens=24, concurrency=8, side_by_side=0)
    # one full-batch step at lr 1e-3: on the tiny model the predicted gain peaks near it (from 4e-3
    # on, the in-sample weights hit the clip; four steps over quarter-batch slices move less in step)
    cfg.train = TrainConfig(base_model=str(base), seed=0,
                            optimizer=OptimizerSettings(lr=1e-3, steps_per_iteration=1, micro_batch_size=16))
    cfg.learner.min_new_turns, cfg.learner.max_turns, cfg.learner.reward_model = 4, 128, True
    cfg.learner.reward_model_labels = "both"  # the real probe labels both ways beside the injected error
    land_traffic(cfg)
    folder = tmp_path / "evals" / TENANT / TASK
    folder.mkdir(parents=True)
    (folder / "liked.toml").write_text("role = \"primary\"\n[scorer]\nkind = \"regex\"\n"
                                       f"pattern = '(?s)^(?!.*{MARK.strip()}).*{LIKED.strip()}'\n")
    (folder / "liked.jsonl").write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"tell me "
                                                                          f"something ({100 + k})"}]}) + "\n"
                                                for k in range(40)))

    # -- the learner, on the wrong reward model -------------------------------------------------
    monkeypatch.setattr(labels, "model_labelled", wrong_on_the_mark(labels.model_labelled))
    r = run_learner(cfg, TENANT, TASK)
    m = r.metrics
    print(f"\nlearner: {m['labelled_turns']} labelled + {m['model_labelled_turns']} model-labelled turns, "
          f"probe AUROC {m['reward_model.auroc']:.3f}; predicted gain {m['reward_model.predicted_gain']:+.3f} "
          f"± {m['reward_model.predicted_gain_se']:.3f} (ESS {m['reward_model.predicted_gain_ess']:.1f} "
          f"of {m['reward_model.predicted_gain_turns']:.0f})")
    assert r.status == "trained" and m["reward_model.usable"] == 1.0 and m["reward_model.auroc"] >= 0.65
    assert m["model_labelled_turns"] >= 24  # the 24 marked turns at least: the error reached the batch
    gain = m["reward_model.predicted_gain"]
    assert gain > 2 * m["reward_model.predicted_gain_se"] > 0, "the learned reward must predict a clear gain"
    meta = AdapterStore(cfg.adapter_root).get(TENANT, TASK, r.adapter_version).meta
    assert meta["reward_model"]["predicted_gain"] == pytest.approx(gain)  # what the gate reads
    assert tracking.client(cfg).get_run(r.mlflow_run_id).data.metrics["reward_model.predicted_gain"] \
        == pytest.approx(gain)

    # -- the gate, on the private evals ---------------------------------------------------------
    state = start_vllm(base, home=cfg.home, port=None, max_loras=2, max_lora_rank=16, max_cpu_loras=4,
                       dtype="float32", start_timeout_s=240)
    try:
        (d,) = gate_candidates(cfg, [{"tenant": TENANT, "task": TASK, "registry_version": r.registry_version}],
                               backend=VllmBackend(state.base_url, cfg.serve.served_model_name))
    finally:
        stop_vllm(cfg.home)
    print("gate:", d["outcome"], *d["reasons"], sep="\n  ")
    assert d["outcome"] == "reject" and not d["passed"]  # not promoted: rejected on its private evals
    assert not d["suites"]["liked"]["passed"]
    assert d["predicted_gain"] == pytest.approx(gain) and d["predicted_gain"] > d["measured_gain"]
    assert d["measured_gain"] == pytest.approx(d["suites"]["liked"]["delta"])
    said = [x for x in d["reasons"] if "reward model predicted" in x]
    assert len(said) == 1 and said[0].startswith("warning: ") and said[0] in [f"warning: {w}" for w in d["warnings"]]
    assert registry.adapter_for_alias(cfg, TENANT, TASK, registry.CHAMPION) is None  # nothing moved
    mv = tracking.client(cfg).get_model_version(registry.model_name(TENANT, TASK), r.registry_version)
    assert mv.tags["tracerl.gate.decision"] == "reject"
    assert "Learned reward: the learner's reward model predicted" in mv.description
    run = tracking.client(cfg).get_run(d["mlflow_run_id"]).data.metrics
    assert run["predicted_gain"] == pytest.approx(gain, abs=1e-6) and run["measured_gain"] < gain


# -- the records, without vLLM ---------------------------------------------------------------------

def test_the_learner_records_the_gain_its_learned_reward_predicts_where_the_gate_reads_it(tmp_path, monkeypatch):
    from pipelines import tracking
    from pipelines.adapters.store import AdapterStore
    from pipelines.config import TracerlConfig
    from pipelines.config.train import OptimizerSettings, TrainConfig
    from pipelines.models.tiny import make_tiny_llama
    from pipelines.train import labels
    from pipelines.train.run import run_learner

    base = make_tiny_llama(tmp_path / "tiny", seed=0, warmup_steps=0)
    cfg = TracerlConfig(home=tmp_path / "home")
    cfg.gate.suites_dir = str(tmp_path / "evals")
    cfg.train = TrainConfig(base_model=str(base), seed=0,
                            optimizer=OptimizerSettings(lr=1e-3, steps_per_iteration=1, micro_batch_size=16))
    cfg.learner.min_new_turns, cfg.learner.max_turns, cfg.learner.reward_model = 4, 64, True
    cfg.learner.reward_model_labels = "both"
    land_traffic(cfg, n=56)
    monkeypatch.setattr(labels, "model_labelled", wrong_on_the_mark(labels.model_labelled))
    r = run_learner(cfg, TENANT, TASK)
    m = r.metrics
    assert r.status == "trained" and m["model_labelled_turns"] >= 12 and m["reward_model.predicted_gain"] > 0
    assert m["reward_model.predicted_gain_turns"] == r.new_turns  # the iteration's new turns, every one
    assert m["reward_model.predicted_gain_se"] > 0 and 1 <= m["reward_model.predicted_gain_ess"] <= r.new_turns
    meta = AdapterStore(cfg.adapter_root).get(TENANT, TASK, r.adapter_version).meta["reward_model"]
    assert meta["predicted_gain"] == m["reward_model.predicted_gain"] and meta["usable"] == 1.0
    logged = tracking.client(cfg).get_run(r.mlflow_run_id).data.metrics
    assert logged["reward_model.predicted_gain"] == pytest.approx(m["reward_model.predicted_gain"])


def _verdict(name: str, role: str, delta: float, high: float):
    from pipelines.gate.decide import SuiteVerdict
    from pipelines.gate.stats import Paired

    return SuiteVerdict(name, role, False, "", Paired("bootstrap", 40, 0.5 + delta, 0.5, delta, delta - 0.05, high,
                                                      0.5, 0.5, 0.95))


@pytest.mark.parametrize("predicted,se,verdicts,measured,said", [
    (0.30, 0.05, [], None, False),                                                  # nothing measured
    (None, None, [_verdict("a", "primary", 0.02, 0.06)], 0.02, False),              # nothing predicted
    (0.30, 0.05, [_verdict("a", "primary", 0.02, 0.06)], 0.02, True),               # ruled out by the evals
    (0.30, 0.15, [_verdict("a", "primary", 0.02, 0.06)], 0.02, False),              # within the prediction's noise
    (0.30, 0.05, [_verdict("a", "primary", 0.25, 0.32)], 0.25, False),              # the evals agree
    (-0.20, 0.01, [_verdict("a", "primary", -0.30, -0.25)], -0.30, False),          # no gain predicted
    (0.30, 0.05, [_verdict("a", "primary", 0.40, 0.45), _verdict("b", "primary", 0.01, 0.05),
                  _verdict("g", "guardrail", -0.50, -0.40)], 0.01, True),           # the smallest primary
])
def test_the_gate_says_when_the_evals_rule_out_the_predicted_gain(predicted, se, verdicts, measured, said):
    from pipelines.gate.decide import predicted_vs_measured

    got, note = predicted_vs_measured(predicted, se, verdicts, 0.95)
    assert got == measured and (note is not None) == said
    if said:
        assert note.startswith(f"reward model predicted {predicted:+.3f}") and f"measured {measured:+.3f}" in note


def _candidate(cfg, tenant: str, task: str, predicted: float, se: float) -> tuple[str, int]:
    """A dummy adapter registered as the learner does, its meta carrying the learned reward's prediction."""
    import uuid

    import mlflow

    from pipelines import tracking
    from pipelines.adapters import registry
    from pipelines.adapters.store import AdapterStore

    src = cfg.home / f"src-{uuid.uuid4().hex[:6]}"
    src.mkdir(parents=True)
    (src / "adapter_config.json").write_text("{}")
    (src / "adapter_model.safetensors").write_bytes(uuid.uuid4().bytes)
    av = AdapterStore(cfg.adapter_root).publish(tenant, task, src, {
        "parent_version": None, "base_model_hash": "x", "data_window": {}, "reward_spec_version": [], "config": {},
        "metrics": {}, "reward_model": {"usable": 1.0, "predicted_gain": predicted, "predicted_gain_se": se}})
    with tracking.run(cfg, "learner", tags={"tracerl.stage": "learner"}, params={}) as run:
        mlflow.log_artifacts(str(av.path), "adapter")
    return registry.register_candidate(cfg, tenant, task, run.info.run_id, av.version, {}), av.version


@pytest.mark.parametrize("quality,outcome,said", [(1, "reject", True), (3, "promote", False)])
def test_the_gate_records_the_predicted_gain_beside_the_measured_one_and_decides_on_the_evals(
        tmp_path, mlflow_server, quality, outcome, said):
    """Scripted replies (gate_fixtures.FakeBackend), a real registry: a candidate no better than the
    base is rejected and the gap is said; one that really gains is promoted, the prediction beside it."""
    from pipelines.adapters.registry import model_name
    from pipelines.gate.run import gate_candidates
    from pipelines.tracking import client
    from tests.gate.gate_fixtures import FakeBackend, policy_for, setup

    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    cfg.gate = gate
    rv, av = _candidate(cfg, tenant, task, predicted=0.3, se=0.05)
    backend = FakeBackend(policy_for({av: (quality, True)}, tenant, task))  # the base: quality 1
    (d,) = gate_candidates(cfg, [{"tenant": tenant, "task": task, "registry_version": rv}], backend=backend)
    assert d["outcome"] == outcome and d["predicted_gain"] == 0.3
    assert d["measured_gain"] == pytest.approx(d["suites"]["answers"]["delta"])
    warned = [x for x in d["reasons"] if x.startswith("warning: reward model predicted +0.300")]
    assert len(warned) == int(said) and any("reward model predicted" in w for w in d["warnings"]) == said
    mv = client(cfg).get_model_version(model_name(tenant, task), rv)
    assert not {"tracerl.gate.predicted_gain", "tracerl.gate.measured_gain"} & set(mv.tags)  # numbers: below
    assert (f"Learned reward: the learner's reward model predicted +0.300 (mean P(liked)); the private evals "
            f"measured {d['measured_gain']:+.3f}") in mv.description
    metrics = client(cfg).get_run(d["mlflow_run_id"]).data.metrics
    assert metrics["predicted_gain"] == 0.3 and metrics["measured_gain"] == pytest.approx(d["measured_gain"])
