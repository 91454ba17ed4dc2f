"""Simulated users' sessions served by a local policy, as the events an app would emit (no gateway).

The served path (`traffic.py`: users -> gateway -> vLLM -> Kafka) is what the product runs and what
`bench/learn.py` measures. Learning proofs that compare several ways of using the same traffic need
that traffic many times over, cheaply: here many `Session`s step in lockstep, one batched
`HFPolicy.sample` per turn, and every turn, feedback and session end becomes a contract event with
the sampled token ids and behaviour logprobs, exactly what the gateway would record. The events are
timestamped from `start` (a turn every `turn_gap_s`, feedback 5 s after its turn) so that a reward
run at a later `now` finds them settled.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from pipelines.contract.events import Event, Feedback, Message, ModelTurn, Sampling, SessionEnd, new_id
from pipelines.sim.families import Reply, model_input
from pipelines.sim.sessions import Session, UserModel


@dataclass(frozen=True)
class OfflineTraffic:
    """Who the users are, how many sessions, and how replies are sampled."""

    tenant: str = "acme"
    app: str = "bot"
    task: str = "style"
    sessions: int = 256
    max_tokens: int = 24
    seed: int = 0
    batch: int = 256              # sessions sampled together
    turn_gap_s: float = 30.0
    adapter_version: int | None = None


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def play_sessions(policy: Any, family: Any, um: UserModel, t: OfflineTraffic,
                  start: datetime) -> tuple[list[Event], list[bool]]:
    """(events, liked per model turn in emission order) of `t.sessions` sessions of `um` users of
    `family`, the policy answering; deterministic for `t.seed` and the policy's sampling seed."""
    rng = random.Random(t.seed)
    pool = family.prompts("train")
    events: list[Event] = []
    liked_all: list[bool] = []
    for lo in range(0, t.sessions, t.batch):
        group = [Session.start(pool, pool[rng.randrange(len(pool))], um, random.Random(rng.getrandbits(64)))
                 for _ in range(min(t.batch, t.sessions - lo))]
        traces = [new_id() for _ in group]
        clock = [start + timedelta(seconds=(lo + i) * 0.01) for i in range(len(group))]
        step = 0
        while any(not s.done for s in group):
            live = [i for i, s in enumerate(group) if not s.done]
            asked = [group[i].messages() for i in live]
            samples = policy.sample([model_input(family, m) for m in asked], 1, t.max_tokens,
                                    seed=t.seed * 7919 + lo * 31 + step)
            for i, m, (s,) in zip(live, asked, samples):
                sess, env = group[i], dict(tenant=t.tenant, app=t.app, trace_id=traces[i], task=t.task)
                turn = ModelTurn(**env, turn_index=len(sess.turns), event_time=_iso(clock[i]), model="offline",
                                 adapter_version=t.adapter_version,
                                 input_messages=[Message(role=x["role"], content=x["content"]) for x in m],
                                 output_text=s.text, output_token_ids=s.output_ids, output_logprobs=s.logprobs,
                                 prompt_token_ids=s.prompt_ids, finish_reason=s.finish_reason,
                                 sampling=Sampling(temperature=1.0, top_p=1.0, top_k=0, max_tokens=t.max_tokens))
                liked = family.liked(Reply(s.text, s.tokens, s.finish_reason))
                rec = sess.observe(s.text, liked)
                events.append(turn)
                liked_all.append(liked)
                for g in rec.signals:
                    events.append(Feedback(**env, turn_id=turn.turn_id, kind=g.kind, value=g.value, text=g.text,
                                           sentiment=g.sentiment, event_time=_iso(clock[i] + timedelta(seconds=5))))
                clock[i] += timedelta(seconds=t.turn_gap_s)
                if sess.done:
                    events.append(SessionEnd(**env, outcome=sess.outcome, task_success=sess.task_success,
                                             turns=len(sess.turns), event_time=_iso(clock[i])))
            step += 1
    return events, liked_all
