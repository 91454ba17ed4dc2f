"""Turns nobody labelled, labelled by the reward model (`pipelines/reward/model.py`), for one learner
iteration of one tenant/task (`learner.reward_model`).

The probe is fitted again each iteration on the target's most recent labelled turns (a vote, an
implicit signal, hindsight: the reward stage's `labelled`), scored on held-out explicit votes and
refused below `learner.reward_model_min_auroc`. Where it is usable, each settled unlabelled turn
it is confident about (`|2p - 1| >= reward_model_min_confidence`) trains with reward +1 (and -1 too
with `reward_model_labels = "both"`) and that confidence as its loss weight; the rest stay untrained
(and stay new: a late label may still come).
A turn's real label always wins: only turns the rewards table calls unlabelled are considered.
A turn's features are computed once per base model (`feature_cache.py`), not once per iteration.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.config import TracerlConfig
from pipelines.lake.consent import consented_sql
from pipelines.lake.query import connect
from pipelines.reward.model import Example, FitReport, RewardModel, RewardModelConfig, combine, features
from pipelines.train.batch import TrainTurn
from pipelines.train.feature_cache import FeatureCache, cache_path

FEATURE_RECIPE = 1  # what `turn_text` and `features` make of a turn: bump when either changes (cached rows go stale)


def labelled_examples(cfg: TracerlConfig, tenant: str, task: str) -> list[tuple[str, list[dict], str, bool, bool]]:
    """(turn id, input messages, reply, liked, explicit) of the target's most recent settled labelled turns
    whose total is not 0 (a 0 says neither liked nor disliked). Fitting the probe is training on a
    user's data: a turn marked ``train = false`` or of a user without consent is never read."""
    con = connect(cfg.lake, cfg.table_store)
    rows = con.execute(f"""
        SELECT t.turn_id, t.input_messages::VARCHAR, t.output_text, r.total,
               (r.thumbs IS NOT NULL OR r.rating IS NOT NULL) AS explicit
        FROM turns t JOIN rewards r ON r.tenant = t.tenant AND r.trace_id = t.trace_id AND r.turn_id = t.turn_id
        WHERE r.settled AND r.labelled AND r.total <> 0 AND t.tenant = ? AND t.task = ?
          AND t.train AND {consented_sql(con, cfg, tenant)}
        QUALIFY row_number() OVER (PARTITION BY t.turn_id ORDER BY r.reward_seq DESC) = 1
        ORDER BY t.event_time DESC LIMIT ?""", [tenant, task, cfg.learner.reward_model_window]).fetchall()
    return [(r[0], json.loads(r[1]) if r[1] else [], r[2] or "", r[3] > 0, bool(r[4])) for r in rows]


def silent_examples(cfg: TracerlConfig, tenant: str, task: str) -> list[tuple[str, list[dict], str]]:
    """(turn id, input messages, reply) of the target's most recent settled turns with no signal at all:
    no vote, regenerate, complaint, abandonment, hindsight (the reward stage's ``NOT labelled``)."""
    con = connect(cfg.lake, cfg.table_store)
    rows = con.execute(f"""
        SELECT t.turn_id, t.input_messages::VARCHAR, t.output_text
        FROM turns t JOIN rewards r ON r.tenant = t.tenant AND r.trace_id = t.trace_id AND r.turn_id = t.turn_id
        WHERE r.settled AND NOT r.labelled AND t.tenant = ? AND t.task = ?
          AND t.train AND {consented_sql(con, cfg, tenant)}
        QUALIFY row_number() OVER (PARTITION BY t.turn_id ORDER BY r.reward_seq DESC) = 1
        ORDER BY t.event_time DESC LIMIT ?""", [tenant, task, cfg.learner.reward_model_window]).fetchall()
    return [(r[0], json.loads(r[1]) if r[1] else [], r[2] or "") for r in rows]


def turn_text(tokenizer: Any, messages: list[dict], reply: str) -> str:
    """What the probe reads: the conversation and the reply as the model saw and wrote them."""
    convo = [m for m in messages if isinstance(m, dict)] + [{"role": "assistant", "content": reply}]
    try:
        return tokenizer.apply_chat_template(convo, tokenize=False)
    except Exception:  # noqa: BLE001 - no chat template, or messages it refuses: plain text
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in convo)


class _TurnFeatures:
    """Turn features through the feature cache (feature_cache.py): only the turns it lacks are
    computed, and the base model is loaded only when one is missing."""

    def __init__(self, cfg: TracerlConfig, tenant: str, task: str, base: Path):
        from pipelines.models.registry import base_model_hash

        self.tenant, self.task, self.base, self.hash = tenant, task, base, base_model_hash(base)
        self.computed, self._lm = 0, None
        try:
            self.cache: FeatureCache | None = FeatureCache(cache_path(cfg))
        except (sqlite3.Error, OSError):  # unusable: compute every turn, as before the cache
            self.cache = None

    def __call__(self, rows: list[tuple[str, list[dict], str]]) -> np.ndarray:
        """Features of ``(turn id, input messages, reply)``, one row each, in order."""
        known: dict[str, np.ndarray] = {}
        if self.cache is not None:
            try:
                known = self.cache.get(self.tenant, self.task, self.hash, FEATURE_RECIPE, [r[0] for r in rows])
            except sqlite3.Error:  # locked past its timeout, or corrupt: compute
                known = {}
        todo = list({r[0]: r for r in rows if r[0] not in known}.values())
        if todo:
            tok, lm = self._model()
            x = features(lm, tok, [turn_text(tok, m, reply) for _, m, reply in todo], [r[2] for r in todo])
            fresh = {r[0]: x[i] for i, r in enumerate(todo)}
            self.computed += len(todo)
            if self.cache is not None:
                try:
                    self.cache.put(self.tenant, self.task, self.hash, FEATURE_RECIPE, fresh)
                except sqlite3.Error:  # the features still count this iteration; the next one computes again
                    pass
            known.update(fresh)
        return np.stack([known[r[0]] for r in rows]) if rows else np.zeros((0, 0), dtype=np.float32)

    def _model(self) -> tuple[Any, Any]:
        if self._lm is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(self.base)
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            self._lm = (tok, AutoModelForCausalLM.from_pretrained(self.base))
        return self._lm

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


def model_labelled(cfg: TracerlConfig, tenant: str, task: str, base: Path,
                   unlabelled: list[TrainTurn]) -> tuple[list[TrainTurn], FitReport]:
    """The unlabelled turns the reward model labels confidently (reward +-1, weight = confidence),
    and the model's report (usable or not, and why)."""
    lc = cfg.learner
    labelled = labelled_examples(cfg, tenant, task)
    model = RewardModel(RewardModelConfig(min_auroc=lc.reward_model_min_auroc,
                                          min_confidence=lc.reward_model_min_confidence, seed=cfg.train.seed))
    if not labelled:
        return [], FitReport(False, "no labelled turns of this target yet")
    # silence as weak evidence of a liked reply (positive-unlabelled), at learner.reward_model_silence_weight
    silent = silent_examples(cfg, tenant, task) if lc.reward_model_silence_weight > 0 else []
    rows = [(tid, m, reply, liked, explicit, False) for tid, m, reply, liked, explicit in labelled] + \
        [(tid, m, reply, True, False, True) for tid, m, reply in silent]
    turn_features = _TurnFeatures(cfg, tenant, task, base)
    try:
        x = turn_features([r[:3] for r in rows])
        report = model.fit([Example(x[i], liked, explicit, lc.reward_model_silence_weight if quiet else 1.0, quiet)
                            for i, (_, _, _, liked, explicit, quiet) in enumerate(rows)])
        if not report.usable or not unlabelled:
            return [], report
        probs = model.predict(turn_features([(t.turn_id, t.input_messages or [], t.output_text) for t in unlabelled]))
    finally:
        turn_features.close()
    out = []
    for t, p in zip(unlabelled, probs):
        reward, weight, source = combine(None, float(p), lc.reward_model_min_confidence)
        if source == "model" and (reward > 0 or lc.reward_model_labels == "both"):
            out.append(replace(t, reward=reward, weight=max(weight, 1e-3)))
    return out, report


def label_sources(cfg: TracerlConfig, tenant: str, turn_ids: list[str]) -> dict[str, int]:
    """How many of ``turn_ids`` (labelled turns) carry each kind of label, by the strongest they
    have: ``explicit`` (a vote or rating), ``implicit`` (regenerate, follow-up, abandonment,
    session, tool, an accepted or edited output), ``hindsight`` (only the next message said it)."""
    import pyarrow as pa

    con = connect(cfg.lake, cfg.table_store)
    con.register("_ids", pa.table({"turn_id": turn_ids}))
    row = con.execute("""
        SELECT count(*) FILTER (WHERE thumbs IS NOT NULL OR rating IS NOT NULL),
               count(*) FILTER (WHERE thumbs IS NULL AND rating IS NULL AND coalesce(
                   output, regenerate, follow_up, abandon, session, tool, retries) IS NOT NULL),
               count(*) FILTER (WHERE thumbs IS NULL AND rating IS NULL AND coalesce(
                   output, regenerate, follow_up, abandon, session, tool, retries) IS NULL AND hindsight IS NOT NULL)
        FROM (SELECT * FROM rewards WHERE settled AND tenant = ? AND turn_id IN (SELECT turn_id FROM _ids)
              QUALIFY row_number() OVER (PARTITION BY turn_id ORDER BY reward_seq DESC) = 1)""", [tenant]).fetchone()
    return {"explicit": row[0], "implicit": row[1], "hindsight": row[2]}


def report_metrics(report: FitReport, model_labelled_turns: int) -> dict[str, float]:
    """The report as MLflow metrics (what was not measured is left out)."""
    m = {"reward_model.usable": float(report.usable), "reward_model.auroc": report.auroc,
         "reward_model.ece": report.ece, "reward_model.train_turns": float(report.n_train),
         "reward_model.holdout_turns": float(report.n_holdout), "reward_model.positives": float(report.positives),
         "reward_model.silent_turns": float(report.silent),
         "reward_model.labelled_turns": float(model_labelled_turns)}
    return {k: v for k, v in m.items() if v == v}

