"""The off-policy estimate of a candidate, wired: the held-back slice of the lake, the candidate's
log-probabilities from a learner forward, the estimator (offpolicy.py), the verdict.

    held-back conversations (pipelines/lake/holdout.py: never trained on), settled, served by the
    champion, with vLLM's logged logprobs -> newest ``canary.offpolicy_max_turns`` turns
      -> log π(reply | context) under the candidate adapter (the learner's own forward, fp32,
         no grad; the same numbers its importance ratios use)
      -> w = min(π/q, clip) -> DR (context-mean reward model) or SNIS -> judge against the
         champion's own mean reward on the same turns (on-policy: its plain mean)

Why the learner's forward and not vLLM's prompt logprobs: it needs no serving engine (the gate may
run against a remote vLLM), and it is the forward whose ratios the learner already trusts; vLLM's
logprobs for the same adapter differ from it by float noise, so the champion's own weights sit
near, not at, 1 (their spread is in the estimate's error through the ESS).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pipelines.config import TracerlConfig
from pipelines.config.canary import CanaryConfig
from pipelines.config.train import TrainConfig
from pipelines.gate.offpolicy import REFUSE, Estimate, OffPolicyVerdict, context_means, doubly_robust, \
    importance_weights, judge, snis
from pipelines.lake.holdout import held_back_sql
from pipelines.lake.query import connect
from pipelines.train.batch import TrainTurn


@dataclass(frozen=True)
class LoggedTurn:
    """One held-back turn: what served, its reward, and log q (the sum of its logged logprobs)."""

    turn: TrainTurn
    context: str          # md5 of the input messages (the reward model's key)
    behaviour: float


def held_back_turns(cfg: TracerlConfig, tenant: str, task: str, champion: int | None,
                    limit: int) -> list[LoggedTurn]:
    """Newest settled turns of held-back conversations that ``champion`` served (None: the base
    model), with logged logprobs; on a canary, its champion arm only."""
    holdout = cfg.canary.holdout_share
    if holdout <= 0:
        return []
    rows = connect(cfg.lake, cfg.table_store).execute(f"""
        SELECT t.turn_id, t.task, t.prompt_token_ids, t.input_messages::VARCHAR, t.output_token_ids,
               t.output_text, t.output_logprobs, r.total, md5(t.input_messages::VARCHAR), t.adapter_version
        FROM turns t JOIN rewards r ON r.tenant = t.tenant AND r.trace_id = t.trace_id AND r.turn_id = t.turn_id
        WHERE r.settled AND t.train AND t.tenant = ? AND t.task = ? AND ({held_back_sql(holdout)})
          AND t.adapter_version IS NOT DISTINCT FROM ? AND (t.arm IS NULL OR t.arm = 'champion')
          AND t.output_logprobs IS NOT NULL AND len(t.output_logprobs) > 0
        QUALIFY row_number() OVER (PARTITION BY t.turn_id ORDER BY r.reward_seq DESC) = 1
        ORDER BY t.event_time DESC LIMIT ?""", [tenant, task, champion, limit]).fetchall()
    return [LoggedTurn(TrainTurn(turn_id=r[0], task=r[1], prompt_token_ids=r[2], input_messages=json.loads(r[3]),
                                 output_token_ids=r[4], output_text=r[5], behaviour_logprobs=r[6],
                                 reward=float(r[7]), group_id=r[8], adapter_version=r[9]),
                       r[8], float(sum(r[6]))) for r in rows]


def target_logprobs(base_model: Path, adapter_dir: Path | None, turns: Sequence[TrainTurn], train: TrainConfig,
                    micro_batch: int = 8) -> list[float]:
    """log π(y_i | x_i) per turn: the sum over its output tokens under ``adapter_dir`` on the base
    model (None: the base itself). Turns must carry their served token ids or texts."""
    from pipelines.train.predicted_gain import sequence_logprobs
    from pipelines.train.step import build_policy

    model, tokenizer = build_policy(base_model, adapter_dir, train, train.seed)
    return sequence_logprobs(model.eval(), tokenizer, turns, micro_batch)


def estimate_from(logged: Sequence[LoggedTurn], target: Sequence[float], cc: CanaryConfig) -> Estimate:
    """The configured estimator on logged turns and the candidate's log π of each."""
    rewards = [t.turn.reward for t in logged]
    w = importance_weights(target, [t.behaviour for t in logged], cc.offpolicy_clip)
    if cc.offpolicy_method == "snis":
        return snis(rewards, w, cc.offpolicy_clip)
    q = context_means(rewards, [t.context for t in logged])
    return doubly_robust(rewards, w, q, q, cc.offpolicy_clip)


def offpolicy_verdict(cfg: TracerlConfig, tenant: str, task: str, candidate_dir: Path,
                      champion: int | None) -> OffPolicyVerdict:
    """Should the candidate at ``candidate_dir`` enter the canary? ``champion``: the adapter version
    that served the slice (None: the base model). ``refuse`` when the slice is too small."""
    from pipelines.models.registry import resolve_base_model

    cc = cfg.canary
    logged = held_back_turns(cfg, tenant, task, champion, cc.offpolicy_max_turns)
    if len(logged) < max(2, cc.offpolicy_min_ess):
        empty = Estimate(cc.offpolicy_method, float("nan"), float("inf"), 0.0, len(logged), 0)
        return OffPolicyVerdict(REFUSE, f"{len(logged)} held-back settled turns served by the champion < "
                                        f"canary.offpolicy_min_ess={cc.offpolicy_min_ess:g}: no estimate "
                                        f"(canary.holdout_share={cc.holdout_share:g} of conversations are held "
                                        f"back once canary.enabled)", empty, float("nan"), float("inf"),
                                float("-inf"), float("inf"))
    base = resolve_base_model(cfg.train.base_model, cfg.home)
    target = target_logprobs(base, candidate_dir, [t.turn for t in logged], cfg.train)
    return judge(estimate_from(logged, target, cc), [t.turn.reward for t in logged],
                 alpha=cfg.canary.alpha, min_ess=cc.offpolicy_min_ess)
