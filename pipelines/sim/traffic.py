"""`tracerl simulate`: a synthetic customer app whose users talk to the gateway.

Each simulated user asks one of the task's training prompts through the gateway (the
OpenAI-compatible endpoint customer apps use), then acts on a hidden preference
(`env.HiddenPreference`: a complete reply that ends with a full stop, within a few dozen
tokens): the app delivers the reply over an SMS tool that fails on a truncated or
over-long message, the user gives thumbs up or down, and the session ends with its
outcome. The gateway records the served turn (token ids, behaviour logprobs, adapter
version) and forwards the feedback, so everything reaches Kafka the way production does.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from pipelines.deploy.service import GatewayClient
from pipelines.sim.env import HiddenPreference, prompts

SMS_LIMIT = 240  # characters the simulated app's SMS tool accepts


@dataclass
class TrafficConfig:
    tenant: str = "acme"
    task: str = "concise"
    requests: int = 96
    users: int = 16                # concurrent users (vLLM batches their requests)
    max_tokens: int = 48
    temperature: float = 1.0       # top_p 1, top_k off: the logged logprobs are the sampling distribution's
    split: str = "train"           # "heldout" prompts are the private eval's: never sent as traffic
    seed: int = 0


@dataclass
class TrafficStats:
    requests: int = 0
    failed: int = 0
    liked: int = 0
    started_at: float = 0.0        # wall clock of the first request
    ended_at: float = 0.0
    versions: dict[str, int] = field(default_factory=dict)   # adapter version -> requests served
    errors: list[str] = field(default_factory=list)

    @property
    def reward(self) -> float:
        """Share of replies the users liked: the live reward of this traffic."""
        return self.liked / max(1, self.requests - self.failed)


def one_user(client: GatewayClient, messages: list[dict], t: TrafficConfig, pref: HiddenPreference,
             seed: int) -> tuple[bool, str]:
    """One session: ask, deliver by SMS, react. Returns (liked, adapter version that served)."""
    r = client.chat(t.task, messages, max_tokens=t.max_tokens, temperature=t.temperature, top_p=1.0, top_k=-1,
                    seed=seed, tracerl={"app": "sim"})
    choice, meta = r["choices"][0], r["tracerl"]
    text, finish = choice["message"].get("content") or "", choice.get("finish_reason")
    tokens = int(r.get("usage", {}).get("completion_tokens", 0))
    liked = pref.liked_reply(text, tokens, finish)
    trace, turn = meta["trace_id"], meta["turn_id"]
    fits = finish == "stop" and len(text) <= SMS_LIMIT
    app = {"task": t.task, "app": "sim"}
    client.tool_call(trace, turn, "send_sms", "ok" if fits else "error", **app,
                     arguments={"chars": len(text)},
                     error=None if fits else ("reply truncated" if finish != "stop" else f"over {SMS_LIMIT} chars"))
    client.feedback(trace, turn, "thumbs", 1 if liked else -1, **app)
    client.end(trace, "completed", task_success=liked, turns=1, **app)
    return liked, meta["adapter_version"]


def simulate(url: str, api_key: str, t: TrafficConfig, pref: HiddenPreference | None = None,
             progress: Callable[[int, int], None] | None = None) -> TrafficStats:
    pref = pref or HiddenPreference(max_tokens=40)
    pool = prompts(t.split)
    random.Random(t.seed).shuffle(pool)  # distinct prompts first, like many different users
    jobs = [(pool[i % len(pool)], t.seed * 100_003 + i) for i in range(t.requests)]
    client = GatewayClient(url, api_key)
    stats = TrafficStats(started_at=time.time())
    done = 0

    def run(job):
        try:
            return one_user(client, job[0], t, pref, job[1]), None
        except Exception as e:  # noqa: BLE001 - counted and reported, the other users go on
            return None, f"{type(e).__name__}: {e}"

    with ThreadPoolExecutor(t.users) as ex:
        for result, error in ex.map(run, jobs):
            done += 1
            stats.requests += 1
            if error:
                stats.failed += 1
                stats.errors.append(error)
            else:
                liked, version = result
                stats.liked += liked
                stats.versions[version] = stats.versions.get(version, 0) + 1
            if progress:
                progress(done, t.requests)
    stats.ended_at = time.time()
    return stats


def summary(stats: TrafficStats) -> str:
    served = ", ".join(f"{v}: {n}" for v, n in sorted(stats.versions.items()))
    return (f"{stats.requests} requests, {stats.failed} failed, live reward {stats.reward:.3f} "
            f"(liked {stats.liked}); served by {served or 'none'}; "
            f"{stats.ended_at - stats.started_at:.0f}s")
