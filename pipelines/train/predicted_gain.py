"""The gain a learner iteration's own reward predicts for the adapter it wrote (#41), so that the gate
can set it beside the gain its private evals measure: a learned reward that is wrong about a feature
shows up as a predicted gain the evals do not see.

    the iteration's new turns, each with its learned reward as P(liked): the reward model's where it
    labelled the turn, (1 + reward * confidence) / 2; the real label's elsewhere, (1 + total) / 2
      -> log pi_old(y|x): what the update started from (the parent adapter, else the base model), and
         log pi_new(y|x): the adapter it wrote (one learner forward each, no grad, one base loaded)
      -> w = min(pi_new / pi_old, clip); after = sum w p / sum w (self-normalised IS); before = mean p
      -> predicted gain = after - before, with its delta-method SE and the weights' ESS

Why pi_old and not the logged q: the update is what the learner answers for. Replies served by older
adapters, or without logged logprobs, would put the gap between what served and the parent in the
number. Scoring both sides with the same forward also cancels the float noise between vLLM and the
learner. The estimator is pipelines/gate/offpolicy.py's `snis`, restated here in a few lines
because train sits below gate in the layers (tests/train/test_predicted_gain.py checks they agree).

It is in-sample and optimistic by design: the update raised the likelihood of exactly these turns in
the direction of their reward. So the number says how hard the learner pushed on its reward, not
what users will see. Its unit, a change in the share of replies liked, compares with a pass-rate
eval's delta only where the eval measures what users like. The gate records both and decides on the
evals alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Collection, Sequence

import numpy as np

from pipelines.config.train import TrainConfig
from pipelines.train.batch import TrainTurn

MAX_TURNS = 128  # turns scored at most (evenly spaced): two no-grad forwards each, beside the training


@dataclass(frozen=True)
class PredictedGain:
    """The learned reward's mean P(liked) under the new adapter minus under the one it started from."""

    value: float      # after - before
    before: float     # mean P(liked) of the turns (under pi_old, which they stand for)
    after: float      # SNIS estimate under pi_new
    se: float         # delta-method standard error of `after`
    ess: float        # (sum w)^2 / sum w^2: n when the update did not move, small when it moved far
    n: int            # turns scored
    clipped: int      # turns whose weight hit the clip

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """As the learner records it (MLflow metrics, the adapter's meta, the Dagster metadata)."""
        m = {"reward_model.predicted_gain": self.value, "reward_model.predicted_gain_se": self.se,
             "reward_model.predicted_gain_ess": self.ess, "reward_model.predicted_gain_turns": float(self.n),
             "reward_model.predicted_before": self.before, "reward_model.predicted_after": self.after}
        return {k: v for k, v in m.items() if np.isfinite(v)}  # what was not measured is left out


def liked_probability(turn: TrainTurn, by_model: bool) -> float:
    """The learned reward of one training turn as P(liked). A reward-model label is +-1 with weight
    |2p - 1| (labels.py), so p = (1 + reward * weight) / 2. A real label (total on [-1, 1]) gives
    (1 + total) / 2."""
    r = float(np.clip(turn.reward, -1.0, 1.0))
    return (1.0 + r * turn.weight) / 2.0 if by_model else (1.0 + r) / 2.0


def predicted_gain(p_liked: Sequence[float], new_logprobs: Sequence[float], old_logprobs: Sequence[float],
                   clip: float) -> PredictedGain:
    """SNIS of P(liked) under pi_new from turns standing for pi_old, minus their plain mean."""
    p = np.asarray(p_liked, dtype=float)
    lp_new, lp_old = np.asarray(new_logprobs, dtype=float), np.asarray(old_logprobs, dtype=float)
    if not (p.shape == lp_new.shape == lp_old.shape and p.ndim == 1 and len(p)):
        raise ValueError(f"{p.size} P(liked), {lp_new.size} new and {lp_old.size} old logprobs: one each per turn")
    if not (clip > 0 and np.isfinite(p).all() and ((p >= 0) & (p <= 1)).all()
            and np.isfinite(lp_old).all() and (lp_new < np.inf).all()):
        raise ValueError("need clip > 0, P(liked) in [0, 1], finite old logprobs and new logprobs < +inf")
    w = np.exp(np.minimum(lp_new - lp_old, np.log(clip)))
    total = float(w.sum())
    before = float(p.mean())
    if total <= 0:  # the new adapter gives none of these replies any mass
        return PredictedGain(float("nan"), before, float("nan"), float("inf"), 0.0, len(p), 0)
    after = float((w * p).sum() / total)
    se = float(np.sqrt((w * w * (p - after) ** 2).sum()) / total)
    ess = total ** 2 / float((w * w).sum())
    return PredictedGain(after - before, before, after, se, ess, len(p), int((w >= clip * (1 - 1e-12)).sum()))


def sequence_logprobs(model: Any, tokenizer: Any, turns: Sequence[TrainTurn], micro_batch: int = 8,
                      autocast: Any = None) -> list[float]:
    """log pi(y_i | x_i) per turn (the sum over its output tokens) under ``model`` as it stands, no
    grad. Every turn must have output tokens (``encode_turns`` drops empty ones)."""
    import contextlib

    import torch

    from pipelines.train.batch import collate, encode_turns
    from pipelines.train.step import micro_batch_key, output_logprobs

    encoded, _ = encode_turns(turns, tokenizer)
    if len(encoded) != len(turns):
        raise ValueError(f"{len(turns) - len(encoded)} turn(s) without output tokens: nothing to score")
    order = sorted(range(len(encoded)), key=lambda i: micro_batch_key(encoded[i]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    out = [0.0] * len(encoded)
    with torch.no_grad(), (autocast or contextlib.nullcontext()):
        for k in range(0, len(order), micro_batch):
            idx = order[k:k + micro_batch]
            b = collate([encoded[i] for i in idx], pad).to(device)
            for i, v in zip(idx, output_logprobs(model, b.input_ids, b.attention_mask, b.loss_mask).sum(1).tolist()):
                out[i] = float(v)
    return out


def learner_predicted_gain(base: Path, parent_dir: Path | None, adapter_dir: Path, turns: Sequence[TrainTurn],
                           model_ids: Collection[str], train: TrainConfig, clip: float,
                           max_turns: int = MAX_TURNS) -> PredictedGain | None:
    """The predicted gain of the adapter at ``adapter_dir`` (trained from ``parent_dir``, None: the
    base) on ``turns``; ``model_ids``: the turns the reward model labelled. None without a turn to
    score. One base is loaded, carrying both adapters, on the learner's device and precision."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipelines.train.device import place

    turns = [t for t in turns if (t.output_token_ids if t.output_token_ids is not None else t.output_text)]
    if len(turns) > max_turns:  # evenly spaced: every label source keeps its share
        turns = [turns[i] for i in np.linspace(0, len(turns) - 1, max_turns).round().astype(int)]
    if not turns:
        return None
    placement = place(train)
    tokenizer = AutoTokenizer.from_pretrained(base)
    lm = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = PeftModel.from_pretrained(lm, adapter_dir, adapter_name="new").to(placement.device).eval()
    new = sequence_logprobs(model, tokenizer, turns, autocast=placement.autocast())
    if parent_dir is None:
        with model.disable_adapter():
            old = sequence_logprobs(model, tokenizer, turns, autocast=placement.autocast())
    else:
        model.load_adapter(str(parent_dir), adapter_name="old")
        model.set_adapter("old")
        old = sequence_logprobs(model.to(placement.device), tokenizer, turns, autocast=placement.autocast())
    p = [liked_probability(t, t.turn_id in model_ids) for t in turns]
    return predicted_gain(p, new, old, clip)
