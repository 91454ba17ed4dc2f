"""Simulated traffic through the real data path, then one learner iteration.

Shared by the proof-of-learning test and `bench/learn.py`: the current champion
samples replies, simulated users react by a hidden preference (any family of
families.py; concise by default) in sessions of one or more turns with explicit or
implicit feedback (sessions.py), the events go through Kafka, the exactly-once ingest,
the reward engine and the learner. The promotion here is unconditional (the gate stage
decides in the full loop).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelines.adapters import registry
from pipelines.config import TracerlConfig
from pipelines.contract.events import Event, Feedback, Message, ModelTurn, Sampling, SessionEnd, ToolCall, new_id
from pipelines.contract.tool_calls import parse_tool_calls
from pipelines.ingest.producer import TraceProducer
from pipelines.ingest.run import run_ingest
from pipelines.reward.engine import run_rewards
from pipelines.sim.env import HiddenPreference
from pipelines.sim.families import model_input
from pipelines.sim.policy import HFPolicy, Sample
from pipelines.sim.sessions import Session, TurnRecord, UserModel
from pipelines.adapters.store import AdapterStore
from pipelines.train.run import LearnerResult, run_learner


@dataclass
class SimTask:
    tenant: str = "acme"
    task: str = "concise"        # the task name the events carry; for_family() sets the family's
    group: int = 4               # samples per training prompt (a GRPO group); each opens its own session
    max_new_tokens: int = 24
    eval_samples: int = 8        # samples per held-out prompt
    train_prompts: int = 96      # how many of the training prompts to serve per iteration
    heldout_prompts: int = 32
    users: UserModel = field(default_factory=UserModel.dense)  # dense: 1 turn, always voted (the proof
                                 # of learning); UserModel() for sparse multi-turn feedback

    def prompts(self, split: str, family: Any = None) -> list[list[dict]]:
        fam = family or HiddenPreference()
        return fam.prompts(split)[: self.train_prompts if split == "train" else self.heldout_prompts]

    @classmethod
    def for_family(cls, family: Any, **kw: Any) -> "SimTask":
        return cls(task=family.task, **kw)


def held_out_reward(policy: HFPolicy, pref: Any, t: SimTask, seed: int) -> float:
    """Mean reward (share of liked replies) on prompts the learner never trains on."""
    held = [model_input(pref, m) for m in t.prompts("heldout", pref)]
    groups = policy.sample(held, t.eval_samples, t.max_new_tokens, seed=seed)
    return statistics.mean(pref.liked(s) for g in groups for s in g)


def turn_events(env: dict, messages: list[dict], s: Sample, rec: TurnRecord, family: Any, *, model: str,
                adapter_version: int | None, max_tokens: int) -> list[Event]:
    """One served turn, the tool calls the app ran, and the user's signals about it."""
    turn = ModelTurn(**env, turn_index=rec.turn_index, model=model, adapter_version=adapter_version,
                     input_messages=[Message(**m) for m in messages], output_text=s.text,
                     output_token_ids=s.output_ids, output_logprobs=s.logprobs, prompt_token_ids=s.prompt_ids,
                     sampling=Sampling(temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens),
                     finish_reason=s.finish_reason)
    out: list[Event] = [turn]
    if getattr(family, "tools", None) and hasattr(family, "run_tool"):
        for call in parse_tool_calls(s.text).calls:
            outcome, error = family.run_tool(call)
            out.append(ToolCall(**env, turn_id=turn.turn_id, name=call.name or "unparsed",
                                arguments=call.arguments, outcome=outcome, error=error))
    out += [Feedback(**env, turn_id=turn.turn_id, kind=g.kind, value=g.value, sentiment=g.sentiment, text=g.text)
            for g in rec.signals]
    return out


def serve_and_collect(cfg: TracerlConfig, policy: HFPolicy, pref: Any, t: SimTask,
                      adapter_version: int | None, seed: int) -> tuple[float, int, dict[str, int]]:
    """Serve the training prompts as sessions, emit turns + signals to Kafka; (live reward, events, counts).

    Turn 0 of every session is sampled in groups of `t.group` per prompt (the GRPO groups);
    later turns of all open sessions are sampled together, one batch per turn index."""
    train = t.prompts("train", pref)
    rng = random.Random(seed)
    sessions = [Session.start(train, m, t.users, random.Random(rng.getrandbits(64)))
                for m in train for _ in range(t.group)]
    traces = [dict(tenant=t.tenant, app="sim", trace_id=new_id(), task=t.task) for _ in sessions]
    events: list[list[Event]] = [[] for _ in sessions]
    liked: list[bool] = []
    first = policy.sample([model_input(pref, m) for m in train], t.group, t.max_new_tokens, seed=seed)
    batch = [(i, s) for i, s in enumerate(x for g in first for x in g)]
    step = 0
    while batch:
        for i, sample in batch:
            sess = sessions[i]
            messages = model_input(pref, sess.messages())
            rec = sess.observe(sample.text, pref.liked(sample))
            liked.append(rec.liked)
            events[i] += turn_events(traces[i], messages, sample, rec, pref, model=cfg.train.base_model,
                                     adapter_version=adapter_version, max_tokens=t.max_new_tokens)
        step += 1
        open_ = [i for i, s in enumerate(sessions) if not s.done]
        if not open_:
            break
        groups = policy.sample([model_input(pref, sessions[i].messages()) for i in open_], 1, t.max_new_tokens,
                               seed=seed + 1000 * step)
        batch = list(zip(open_, (g[0] for g in groups)))
    counts = {"sessions": len(sessions), "turns": len(liked), "voted": 0, "abandoned": 0}
    n = 0
    with TraceProducer(cfg) as producer:
        for sess, env, evs in zip(sessions, traces, events):
            counts["voted"] += sum(r.voted for r in sess.turns)
            counts["abandoned"] += sess.outcome == "abandoned"
            for e in [*evs, SessionEnd(**env, outcome=sess.outcome, task_success=sess.task_success,
                                       turns=len(sess.turns))]:
                producer.send(e)
                n += 1
    return statistics.mean(liked), n, counts


def iterate(cfg: TracerlConfig, base: Path, policy: HFPolicy, pref: Any, t: SimTask,
            adapter_version: int | None, seed: int, now: datetime) -> tuple[LearnerResult, HFPolicy, dict]:
    """One turn of the loop; `now` is the event-time clock used to settle rewards."""
    live, events, counts = serve_and_collect(cfg, policy, pref, t, adapter_version, seed)
    ingest = run_ingest(cfg)
    run_rewards(cfg.lake, now=now)
    r = run_learner(cfg, t.tenant, t.task)
    if r.status == "trained":
        registry.set_alias(cfg, t.tenant, t.task, registry.CHAMPION, r.registry_version)
        path = AdapterStore(cfg.adapter_root).get(t.tenant, t.task, r.adapter_version).path
        policy = HFPolicy(base, path)
    return r, policy, {"live_reward": live, "events": events, "landed": ingest.landed, **counts}


__all__ = ["SimTask", "held_out_reward", "iterate", "serve_and_collect", "turn_events"]
