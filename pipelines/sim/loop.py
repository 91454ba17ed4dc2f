"""Simulated traffic through the real data path, then one learner iteration.

Shared by the proof-of-learning test and `bench/learn.py`: the current champion
samples replies, simulated users react by a hidden preference, the events go
through Kafka, the exactly-once ingest, the reward engine and the learner. The
promotion here is unconditional (the gate stage decides in the full loop).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pipelines import registry
from pipelines.config import TracerlConfig
from pipelines.ingest.producer import TraceProducer
from pipelines.ingest.run import run_ingest
from pipelines.reward.engine import run_rewards
from pipelines.sim.env import HiddenPreference, episode, prompts
from pipelines.sim.policy import HFPolicy
from pipelines.train.adapters import AdapterStore
from pipelines.train.run import LearnerResult, run_learner


@dataclass
class SimTask:
    tenant: str = "acme"
    task: str = "concise"
    group: int = 4               # samples per training prompt (a GRPO group)
    max_new_tokens: int = 24
    eval_samples: int = 8        # samples per held-out prompt
    train_prompts: int = 96      # how many of the training prompts to serve per iteration
    heldout_prompts: int = 32

    def prompts(self, split: str) -> list[list[dict]]:
        return prompts(split)[: self.train_prompts if split == "train" else self.heldout_prompts]


def held_out_reward(policy: HFPolicy, pref: HiddenPreference, t: SimTask, seed: int) -> float:
    """Mean reward (share of liked replies) on prompts the learner never trains on."""
    groups = policy.sample(t.prompts("heldout"), t.eval_samples, t.max_new_tokens, seed=seed)
    return statistics.mean(pref.liked(s) for g in groups for s in g)


def serve_and_collect(cfg: TracerlConfig, policy: HFPolicy, pref: HiddenPreference, t: SimTask,
                      adapter_version: str | None, seed: int) -> tuple[float, int]:
    """Serve the training prompts, emit turns + feedback to Kafka; (live reward, events)."""
    train = t.prompts("train")
    groups = policy.sample(train, t.group, t.max_new_tokens, seed=seed)
    liked, n = [], 0
    with TraceProducer(cfg) as producer:
        for messages, group in zip(train, groups):
            for s in group:
                liked.append(pref.liked(s))
                for e in episode(messages, s, liked[-1], tenant=t.tenant, app="sim", task=t.task,
                                 model=cfg.train.base_model, adapter_version=adapter_version,
                                 max_tokens=t.max_new_tokens):
                    producer.send(e)
                    n += 1
    return statistics.mean(liked), n


def iterate(cfg: TracerlConfig, base: Path, policy: HFPolicy, pref: HiddenPreference, t: SimTask,
            adapter_version: str | None, seed: int, now: datetime) -> tuple[LearnerResult, HFPolicy, dict]:
    """One turn of the loop; `now` is the event-time clock used to settle rewards."""
    live, events = serve_and_collect(cfg, policy, pref, t, adapter_version, seed)
    ingest = run_ingest(cfg)
    run_rewards(cfg.lake, now=now)
    r = run_learner(cfg, t.tenant, t.task)
    if r.status == "trained":
        registry.set_alias(cfg, t.tenant, t.task, registry.CHAMPION, r.registry_version)
        path = AdapterStore(cfg.adapter_root).get(t.tenant, t.task, r.adapter_version).path
        policy = HFPolicy(base, path)
    return r, policy, {"live_reward": live, "events": events, "landed": ingest.landed}

