"""The gain a learner iteration's learned reward predicts (pipelines/train/predicted_gain.py): the
estimator is the gate's SNIS, an update that did not move predicts nothing, one that raised the liked
replies predicts a gain. On the tiny Llama: the learner's forwards with one base carrying both
adapters, and a real train_step."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.gate.offpolicy import importance_weights, snis
from pipelines.train.batch import TrainTurn
from pipelines.train.predicted_gain import learner_predicted_gain, liked_probability, predicted_gain


def test_an_update_that_did_not_move_predicts_no_gain():
    lp = [-12.0, -30.5, -7.25, -18.0]
    g = predicted_gain([0.9, 0.1, 0.5, 1.0], lp, lp, clip=20.0)
    assert g.value == 0.0 and g.after == g.before == pytest.approx(0.625) and g.ess == pytest.approx(4.0)
    assert g.n == 4 and g.clipped == 0


def test_it_is_the_gates_snis():
    rng = np.random.default_rng(0)
    p, old = rng.uniform(0, 1, 200), rng.uniform(-40, -5, 200)
    new = old + rng.normal(0, 1.5, 200)
    g = predicted_gain(p, new, old, clip=20.0)
    e = snis(p, importance_weights(new, old, 20.0), 20.0)
    assert (g.after, g.se, g.ess, g.clipped) == pytest.approx((e.value, e.se, e.ess, e.clipped))
    assert g.clipped > 0 and g.value == pytest.approx(e.value - p.mean())


@pytest.mark.parametrize("liked_up,sign", [(True, 1), (False, -1)])
def test_raising_the_liked_replies_predicts_a_gain_and_the_disliked_a_loss(liked_up, sign):
    p = np.array([0.95, 0.95, 0.05, 0.05, 1.0, 0.0])
    old = np.full(6, -20.0)
    new = old + np.where((p > 0.5) == liked_up, 1.0, -1.0)
    g = predicted_gain(p, new, old, clip=20.0)
    assert np.sign(g.value) == sign and abs(g.value) > 0.3 and g.ess < 6


@pytest.mark.parametrize("reward,weight,by_model,p", [
    (1.0, 0.9, True, 0.95),    # the reward model's +1 at confidence |2p - 1| = 0.9
    (-1.0, 0.6, True, 0.2),
    (1.0, 1.0, False, 1.0),    # a real label: the total on [-1, 1]
    (-1.0, 1.0, False, 0.0),
    (0.5, 0.25, False, 0.75),  # a real label ignores the weight (a replayed turn's age decay)
    (3.0, 1.0, False, 1.0),    # clipped to the reward scale
])
def test_liked_probability(reward, weight, by_model, p):
    t = TrainTurn("t", "task", [1], None, [2], "x", None, reward, weight=weight)
    assert liked_probability(t, by_model) == pytest.approx(p)


@pytest.mark.parametrize("p,new,old,clip,words", [
    ([0.5], [-1.0, -2.0], [-1.0], 20.0, "one each per turn"),
    ([], [], [], 20.0, "one each per turn"),
    ([1.5], [-1.0], [-1.0], 20.0, r"P\(liked\) in \[0, 1\]"),
    ([0.5], [-1.0], [float("-inf")], 20.0, "finite old logprobs"),
    ([0.5], [-1.0], [-1.0], 0.0, "clip > 0"),
])
def test_what_cannot_be_estimated_is_refused(p, new, old, clip, words):
    with pytest.raises(ValueError, match=words):
        predicted_gain(p, new, old, clip)


# -- on the tiny Llama -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from pipelines.models.tiny import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny", seed=0, warmup_steps=0)


def _turns(n: int = 16) -> list[TrainTurn]:
    """Two replies per prompt, liked when they end with ' 42 42 42' (a real label on odd prompts, the
    reward model's +-1 at confidence 0.8 on even ones)."""
    out = []
    for i in range(n):
        liked = i % 2 == 0
        out.append(TrainTurn(f"t{i}", "chat", None, [{"role": "user", "content": f"tell me something ({i // 2})"}],
                             None, "the cat sat on a mat" + (" 42 42 42" if liked else " and ran"), None,
                             1.0 if liked else -1.0, group_id=f"g{i // 2}", weight=0.8 if (i // 2) % 2 == 0 else 1.0))
    return out


def test_on_the_tiny_model_an_update_toward_the_liked_replies_predicts_a_gain(tiny, tmp_path):
    from pipelines.config.train import OptimizerSettings, TrainConfig
    from pipelines.train.step import build_policy, train_step

    cfg = TrainConfig(base_model=str(tiny), seed=0, optimizer=OptimizerSettings(lr=1e-3, steps_per_iteration=1,
                                                                                micro_batch_size=16))
    turns = _turns()
    by_model = {t.turn_id for t in turns if t.weight < 1}
    # a fresh LoRA (B = 0) is the base model itself: no gain, every weight 1
    fresh, _ = build_policy(tiny, None, cfg, seed=0)
    fresh.save_pretrained(tmp_path / "fresh")
    g0 = learner_predicted_gain(tiny, None, tmp_path / "fresh", turns, by_model, cfg, clip=20.0)
    assert g0 is not None and abs(g0.value) < 1e-6 and g0.ess == pytest.approx(len(turns))
    assert g0.before == pytest.approx(np.mean([liked_probability(t, t.turn_id in by_model) for t in turns]))

    step = train_step(tiny, None, turns, cfg, tmp_path / "trained", seed=0, current_version=0)
    g = learner_predicted_gain(tiny, None, step.adapter_dir, turns, by_model, cfg, clip=20.0)
    assert g.value > 2 * g.se > 0 and g.ess < len(turns)
    # from a parent (the base carries both adapters): the adapter against itself predicts nothing
    same = learner_predicted_gain(tiny, step.adapter_dir, step.adapter_dir, turns, by_model, cfg, clip=20.0)
    assert abs(same.value) < 1e-6 and same.ess == pytest.approx(len(turns))
    # and the trained adapter against the fresh one is the same update seen from an equal start
    assert learner_predicted_gain(tiny, tmp_path / "fresh", step.adapter_dir, turns, by_model, cfg,
                                  clip=20.0).value == pytest.approx(g.value, abs=1e-5)
    # a cap on the turns scored keeps every label source (evenly spaced)
    capped = learner_predicted_gain(tiny, None, step.adapter_dir, turns, by_model, cfg, clip=20.0, max_turns=8)
    assert capped.n == 8
    assert learner_predicted_gain(tiny, None, step.adapter_dir, [], by_model, cfg, clip=20.0) is None
