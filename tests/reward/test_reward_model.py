"""The reward model (pipelines/reward/model.py): it learns a preference from few labels, says what it
is worth on held-out votes, refuses itself when it is worth nothing, and never beats a real label."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.reward.model import Example, RewardModel, RewardModelConfig, auroc, calibration, combine, features


def _turns(n: int, liked_share: float, signal: float, seed: int, dim: int = 16, explicit_share: float = 1.0):
    """Synthetic turn features: liked turns are shifted by `signal` along one direction."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        liked = bool(rng.random() < liked_share)
        x = rng.normal(size=dim)
        x[0] += signal if liked else 0.0
        out.append(Example(x.astype(np.float32), liked, explicit=bool(rng.random() < explicit_share)))
    return out


def test_a_real_preference_is_learned_and_scored_on_held_out_votes():
    model = RewardModel()
    report = model.fit(_turns(200, 0.2, signal=2.5, seed=1))
    assert report.usable and report.auroc > 0.85, report
    assert 0 <= report.ece < 0.3 and sum(b["n"] for b in report.reliability) == report.n_holdout > 0
    fresh = _turns(400, 0.2, signal=2.5, seed=2)
    probs = model.predict(np.stack([e.features for e in fresh]))
    assert auroc(probs, [e.liked for e in fresh]) > 0.85


def test_labels_that_say_nothing_give_a_model_that_refuses_itself():
    report = RewardModel().fit(_turns(200, 0.3, signal=0.0, seed=3))
    assert not report.usable and "AUROC" in report.reason and report.auroc < 0.65


@pytest.mark.parametrize("liked_share, reason", [(0.0, "nothing to learn from yet"), (1.0, "nothing to learn from yet")])
def test_no_positives_yet_is_a_reason_not_a_crash(liked_share, reason):
    model = RewardModel()
    report = model.fit(_turns(50, liked_share, signal=2.0, seed=4))
    assert not report.usable and reason in report.reason
    with pytest.raises(RuntimeError, match="not fitted"):
        model.predict(np.zeros((1, 16)))


def test_without_held_out_votes_its_worth_is_unknown_so_it_is_not_used():
    report = RewardModel().fit(_turns(100, 0.3, signal=3.0, seed=5, explicit_share=0.0))
    assert not report.usable and "cannot be measured" in report.reason


def test_a_real_label_always_wins_and_a_prediction_counts_only_when_confident():
    assert combine(-1.0, 0.99, 0.5) == (-1.0, 1.0, "label")
    assert combine(None, 0.9, 0.5) == (1.0, pytest.approx(0.8), "model")
    assert combine(None, 0.1, 0.5) == (-1.0, pytest.approx(0.8), "model")
    assert combine(None, 0.6, 0.5) == (0.0, 0.0, "none")
    assert combine(None, None, 0.5) == (0.0, 0.0, "none")
    assert combine(None, float("nan"), 0.5) == (0.0, 0.0, "none")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=200))
def test_calibration_error_is_a_weighted_gap_on_0_1(pairs):
    probs, labels = zip(*pairs)
    ece, table = calibration(probs, labels)
    assert 0 <= ece <= 1 and sum(b["n"] for b in table) == len(pairs)
    assert all(0 <= b["mean_p"] <= 1 and 0 <= b["liked"] <= 1 for b in table)
    a = auroc(probs, labels)
    assert math.isnan(a) == (all(labels) or not any(labels)) and (math.isnan(a) or 0 <= a <= 1)


def test_features_are_the_base_model_s_pooled_hidden_states(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipelines.models.tiny import make_tiny_llama

    path = make_tiny_llama(tmp_path / "tiny", warmup_steps=0)
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    x = features(model, tok, ["a short reply.", "a much longer reply that goes on and on", "a short reply."],
                 batch_size=2)
    assert x.shape == (3, model.config.hidden_size) and np.isfinite(x).all()
    assert np.allclose(x[0], x[2], atol=1e-5) and not np.allclose(x[0], x[1])  # padding does not leak in
    both = features(model, tok, ["q: hi. a: yes", "q: hi. a: no"], ["yes", "no"], batch_size=2)
    assert both.shape == (2, 2 * model.config.hidden_size)  # the conversation, then the reply alone
    assert np.allclose(both[:, model.config.hidden_size:], features(model, tok, ["yes", "no"]), atol=1e-5)


def test_silence_is_weak_evidence_never_a_class_of_its_own():
    """Silent turns (no signal at all) fit as liked at a small weight (positive-unlabelled); they never
    make up for missing real positives, and the report counts them apart."""
    negatives = [e for e in _turns(120, 0.0, signal=2.0, seed=6)]
    silent = [Example(e.features, True, False, weight=0.05, silent=True) for e in _turns(300, 0.2, signal=2.0, seed=7)]
    report = RewardModel().fit(negatives + silent)
    assert not report.usable and "0 liked" in report.reason and "nothing to learn from yet" in report.reason
    liked = _turns(200, 0.2, signal=2.5, seed=1)
    report = RewardModel().fit(liked + silent)
    assert report.usable and report.silent == len(silent) and report.positives == sum(e.liked for e in liked)
