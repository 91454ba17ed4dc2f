"""Turns nobody labelled, labelled by the reward model (`pipelines/reward/model.py`), for one learner
iteration of one tenant/task (`learner.reward_model`).

The probe is fitted again each iteration on the target's most recent labelled turns (a vote, an
implicit signal, hindsight: the reward stage's `labelled`), scored on held-out explicit votes and
refused below `learner.reward_model_min_auroc`. Where it is usable, each settled unlabelled turn
it is confident about (`|2p - 1| >= reward_model_min_confidence`) trains with reward +1 (and -1 too
with `reward_model_labels = "both"`) and that confidence as its loss weight; the rest stay untrained (and stay new: a late label may still come).
A turn's real label always wins: only turns the rewards table calls unlabelled are considered.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipelines.config import TracerlConfig
from pipelines.lake.query import connect
from pipelines.reward.model import Example, FitReport, RewardModel, RewardModelConfig, combine, features
from pipelines.train.batch import TrainTurn


def labelled_examples(cfg: TracerlConfig, tenant: str, task: str) -> list[tuple[list[dict], str, bool, bool]]:
    """(input messages, reply, liked, explicit) of the target's most recent settled labelled turns
    whose total is not 0 (a 0 says neither liked nor disliked)."""
    con = connect(cfg.lake, cfg.table_store)
    rows = con.execute("""
        SELECT t.input_messages::VARCHAR, t.output_text, r.total,
               (r.thumbs IS NOT NULL OR r.rating IS NOT NULL) AS explicit
        FROM turns t JOIN rewards r ON r.tenant = t.tenant AND r.trace_id = t.trace_id AND r.turn_id = t.turn_id
        WHERE r.settled AND r.labelled AND r.total <> 0 AND t.tenant = ? AND t.task = ?
        QUALIFY row_number() OVER (PARTITION BY t.turn_id ORDER BY r.reward_seq DESC) = 1
        ORDER BY t.event_time DESC LIMIT ?""", [tenant, task, cfg.learner.reward_model_window]).fetchall()
    return [(json.loads(r[0]) if r[0] else [], r[1] or "", r[2] > 0, bool(r[3])) for r in rows]


def silent_examples(cfg: TracerlConfig, tenant: str, task: str) -> list[tuple[list[dict], str]]:
    """(input messages, reply) of the target's most recent settled turns with no signal at all:
    no vote, regenerate, complaint, abandonment, hindsight (the reward stage's ``NOT labelled``)."""
    con = connect(cfg.lake, cfg.table_store)
    rows = con.execute("""
        SELECT t.input_messages::VARCHAR, t.output_text
        FROM turns t JOIN rewards r ON r.tenant = t.tenant AND r.trace_id = t.trace_id AND r.turn_id = t.turn_id
        WHERE r.settled AND NOT r.labelled AND t.tenant = ? AND t.task = ?
        QUALIFY row_number() OVER (PARTITION BY t.turn_id ORDER BY r.reward_seq DESC) = 1
        ORDER BY t.event_time DESC LIMIT ?""", [tenant, task, cfg.learner.reward_model_window]).fetchall()
    return [(json.loads(r[0]) if r[0] else [], r[1] or "") for r in rows]


def turn_text(tokenizer: Any, messages: list[dict], reply: str) -> str:
    """What the probe reads: the conversation and the reply as the model saw and wrote them."""
    convo = [m for m in messages if isinstance(m, dict)] + [{"role": "assistant", "content": reply}]
    try:
        return tokenizer.apply_chat_template(convo, tokenize=False)
    except Exception:  # noqa: BLE001 - no chat template, or messages it refuses: plain text
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in convo)


def model_labelled(cfg: TracerlConfig, tenant: str, task: str, base: Path,
                   unlabelled: list[TrainTurn]) -> tuple[list[TrainTurn], FitReport]:
    """The unlabelled turns the reward model labels confidently (reward +-1, weight = confidence),
    and the model's report (usable or not, and why)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lc = cfg.learner
    labelled = labelled_examples(cfg, tenant, task)
    model = RewardModel(RewardModelConfig(min_auroc=lc.reward_model_min_auroc,
                                          min_confidence=lc.reward_model_min_confidence, seed=cfg.train.seed))
    if not labelled:
        return [], FitReport(False, "no labelled turns of this target yet")
    tok = AutoTokenizer.from_pretrained(base)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    lm = AutoModelForCausalLM.from_pretrained(base)
    # silence as weak evidence of a liked reply (positive-unlabelled), at learner.reward_model_silence_weight
    silent = silent_examples(cfg, tenant, task) if lc.reward_model_silence_weight > 0 else []
    rows = [(m, reply, liked, explicit, False) for m, reply, liked, explicit in labelled] + \
        [(m, reply, True, False, True) for m, reply in silent]
    x = features(lm, tok, [turn_text(tok, m, reply) for m, reply, *_ in rows], [r[1] for r in rows])
    report = model.fit([Example(x[i], liked, explicit, lc.reward_model_silence_weight if quiet else 1.0, quiet)
                        for i, (_, _, liked, explicit, quiet) in enumerate(rows)])
    if not report.usable or not unlabelled:
        return [], report
    probs = model.predict(features(lm, tok, [turn_text(tok, t.input_messages or [], t.output_text) for t in unlabelled],
                                   [t.output_text for t in unlabelled]))
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

