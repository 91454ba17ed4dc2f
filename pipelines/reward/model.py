"""A reward model learned from the labelled turns, to label the turns nobody labelled (#41).

Under production-like traffic most turns carry no label (docs/learning.md, "Realistic users":
21-24% at 5% votes) and nearly every label is negative. A probe on the base model's hidden
states, fitted per tenant/task on the labelled turns, predicts P(liked) for the rest.

Why a linear probe on frozen hidden states, not a LoRA reward head: on 2 CPU cores one forward
pass of the base model per turn is the whole cost (the features are also what the learner's
forward pass computes), a logistic regression on them fits in milliseconds, and with a handful of
positives per iteration a model with ~one weight per hidden unit and an L2 prior is what the data
can support; a trained head would over-fit them. The probe is honest about itself: it is scored on
held-out *explicit* votes (AUROC, expected calibration error, a reliability table) and refused
below ``min_auroc``, or when the labels cannot fit it (no positives yet).

A turn's own label always wins (`combine`); a prediction labels a turn only when its confidence
``|2p - 1|`` reaches ``min_confidence``, and is weighted by that confidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class RewardModelConfig:
    min_auroc: float = 0.65        # refuse a probe whose held-out AUROC is below this
    min_confidence: float = 0.5    # use a prediction only where |2p - 1| >= this
    folds: int = 5                 # the explicitly voted turns are scored out of fold (cross-fitting)
    min_per_class: int = 3         # fewer positives or negatives than this: no fit ("no positives yet")
    l2: float = 1.0                # the logistic regression's C is 1 / l2
    bins: int = 10                 # reliability bins of the calibration error
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0.5 <= self.min_auroc <= 1 and 0 <= self.min_confidence <= 1 and self.folds >= 2
                and self.min_per_class >= 1 and self.l2 > 0 and self.bins >= 2):
            raise ValueError(f"reward model settings out of range: {self}")


@dataclass(frozen=True)
class Example:
    """One labelled turn: its features, whether it was liked, and where the label came from."""

    features: np.ndarray
    liked: bool
    explicit: bool                 # a vote (thumbs, rating): held-out scoring uses only these
    weight: float = 1.0            # an implicit label's confidence
    silent: bool = False           # no signal at all, fitted as weakly liked (positive-unlabelled)


@dataclass
class FitReport:
    """What the probe is worth, on held-out explicit votes. ``usable`` False: ``reason`` says why."""

    usable: bool
    reason: str
    n_train: int = 0
    n_holdout: int = 0
    positives: int = 0
    silent: int = 0                # silent turns fitted as weakly liked
    auroc: float = float("nan")
    ece: float = float("nan")
    reliability: list[dict[str, float]] = field(default_factory=list)  # per bin: mean p, liked share, n


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve (NaN with one class only)."""
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels, dtype=bool)
    if labels.all() or not labels.any():
        return float("nan")
    return float(roc_auc_score(labels, np.asarray(scores, dtype=float)))


def calibration(probs: Sequence[float], labels: Sequence[bool], bins: int = 10) -> tuple[float, list[dict[str, float]]]:
    """(expected calibration error, the reliability table): equal-width bins of P(liked), each with
    its mean prediction, the share actually liked and its count; the error is their gap weighted by
    count."""
    p, y = np.asarray(probs, dtype=float), np.asarray(labels, dtype=float)
    if len(p) == 0:
        return float("nan"), []
    which = np.minimum((p * bins).astype(int), bins - 1)
    table, gap = [], 0.0
    for b in range(bins):
        mask = which == b
        n = int(mask.sum())
        if n:
            mean_p, liked = float(p[mask].mean()), float(y[mask].mean())
            gap += n * abs(mean_p - liked)
            table.append({"bin": b / bins, "mean_p": round(mean_p, 4), "liked": round(liked, 4), "n": n})
    return gap / len(p), table


class RewardModel:
    """A logistic-regression probe over turn features; `fit` then `predict`."""

    def __init__(self, config: RewardModelConfig | None = None):
        self.config = config or RewardModelConfig()
        self._clf: Any = None
        self.report = FitReport(False, "not fitted")

    def fit(self, examples: Sequence[Example]) -> FitReport:
        """Fit on the labelled turns and score on held-out explicit votes; never raises on data that
        cannot fit (too few labels of a class): the report says so and the model stays unusable."""
        c = self.config
        self._clf = None
        positives = sum(e.liked for e in examples if not e.silent)   # silence never makes a class
        negatives = sum(not e.liked for e in examples)
        if positives < c.min_per_class or negatives < c.min_per_class:
            self.report = FitReport(False, f"{positives} liked and {negatives} disliked labelled turns: "
                                           f"fewer than {c.min_per_class} of a class, nothing to learn from yet",
                                    positives=positives)
            return self.report
        # Scored out of fold: each explicit vote is predicted by a probe fitted without its fold, so
        # every vote is held out once (with ~5 liked votes in an iteration, a single 30% hold-out
        # kept one or two of them, and its AUROC swung 0.26 <-> 1.00 by the split alone); the probe
        # that labels turns is then fitted on all of them.
        explicit = [i for i, e in enumerate(examples) if e.explicit]
        voted = [examples[i].liked for i in explicit]
        report = FitReport(False, "", n_train=len(examples), n_holdout=len(explicit), positives=positives,
                           silent=sum(e.silent for e in examples))
        folds = min(c.folds, sum(voted), len(voted) - sum(voted))
        if folds >= 2:
            from sklearn.model_selection import StratifiedKFold

            oof = np.full(len(explicit), np.nan)
            split = StratifiedKFold(folds, shuffle=True, random_state=c.seed).split(np.zeros(len(voted)), voted)
            for _, held in split:
                out = {explicit[j] for j in held}
                train = [e for i, e in enumerate(examples) if i not in out]
                if len({e.liked for e in train if not e.silent}) == 2:
                    oof[held] = self._fitted(train).predict_proba(
                        np.stack([examples[explicit[j]].features for j in held]))[:, 1]
            scored = ~np.isnan(oof)
            labels = np.asarray(voted)[scored]
            report.n_holdout = int(scored.sum())
            report.auroc = auroc(oof[scored], labels)
            report.ece, report.reliability = calibration(oof[scored], labels, c.bins)
        self._clf = self._fitted(examples)
        if math.isnan(report.auroc):
            report.reason = "no held-out explicit votes of both classes: its AUROC cannot be measured"
        elif report.auroc < c.min_auroc:
            report.reason = f"held-out AUROC {report.auroc:.3f} < reward_model.min_auroc {c.min_auroc}"
        else:
            report.usable, report.reason = True, f"held-out AUROC {report.auroc:.3f} >= {c.min_auroc}"
        self.report = report
        return report

    def _fitted(self, examples: Sequence[Example]) -> Any:
        """A probe fitted on ``examples`` (liked is class 1)."""
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        # standardized first: hidden units differ in scale by orders of magnitude, and an L2 prior on
        # raw units would flatten every prediction toward 0.5 (no confident label from a real signal)
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0 / self.config.l2, class_weight="balanced",
                                                                 max_iter=1000))
        clf.fit(np.stack([e.features for e in examples]), [bool(e.liked) for e in examples],
                logisticregression__sample_weight=[e.weight for e in examples])
        return clf

    def predict(self, features: np.ndarray) -> np.ndarray:
        """P(liked) per row of ``features``."""
        if self._clf is None:
            raise RuntimeError(f"the reward model is not fitted: {self.report.reason}")
        return self._clf.predict_proba(np.atleast_2d(features))[:, list(self._clf.classes_).index(True)]


def combine(label: float | None, p_liked: float | None, min_confidence: float) -> tuple[float, float, str]:
    """(reward on [-1, 1], training weight, source) of one turn: its real label wins; else the
    prediction where confident enough, weighted by its confidence; else nothing (weight 0)."""
    if label is not None:
        return float(label), 1.0, "label"
    if p_liked is None or not math.isfinite(p_liked):
        return 0.0, 0.0, "none"
    confidence = abs(2 * p_liked - 1)
    if confidence < min_confidence:
        return 0.0, 0.0, "none"
    return (1.0 if p_liked > 0.5 else -1.0), confidence, "model"


def features(model: Any, tokenizer: Any, texts: Sequence[str], replies: Sequence[str] | None = None,
             batch_size: int = 64, max_tokens: int = 512) -> np.ndarray:
    """The base model's last hidden state, mean-pooled over each text's tokens (no gradient); with
    ``replies``, the reply alone pooled the same way and appended. Why both: pooled over the whole
    conversation a reply's own features are diluted by the question; on the tiny model's style
    traffic (docs/learning.md) the probe's AUROC against the users' real verdicts was 0.82 on the
    conversation, 0.91 on the reply alone and 0.92 on both. (Pooling the reply's span inside the
    conversation pass instead of a second pass was measured too: half the cost, but its confident
    positives were right 31-54% of the time against 56-75%.)"""
    pooled = _pooled(model, tokenizer, texts, batch_size, max_tokens)
    if replies is None:
        return pooled
    return np.hstack([pooled, _pooled(model, tokenizer, replies, batch_size, max_tokens)]) if len(texts) else pooled


def _pooled(model: Any, tokenizer: Any, texts: Sequence[str], batch_size: int, max_tokens: int) -> np.ndarray:
    """Mean-pooled last hidden states. The decoder alone runs (the LM head's logits are never read:
    on SmolLM2 they are a 49k-wide matmul per token), in batches of similar length (little padding):
    2.3x faster than a logits pass in input order on the tiny model, the same features to 1e-6."""
    import torch

    if not len(texts):
        return np.zeros((0, 0), dtype=np.float32)
    model.eval()
    body = model.get_decoder() if hasattr(model, "get_decoder") else model
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: np.ndarray | None = None
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = tokenizer([texts[i] for i in idx], return_tensors="pt", padding=True,
                              truncation=True, max_length=max_tokens)
            hidden = body(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            rows = ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).float().cpu().numpy()
            if out is None:
                out = np.zeros((len(texts), rows.shape[1]), dtype=np.float32)
            out[idx] = rows
    return out
