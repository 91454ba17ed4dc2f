"""`tracerl simulate`: a synthetic customer app whose users talk to the gateway.

Each simulated user opens a session with one of the task's training prompts through the
gateway (the OpenAI-compatible endpoint customer apps use) and goes on for a few turns
(`turns_per_session`; later turns continue the trace through the gateway's
`tracerl: {trace_id, turn_index}` field). After each reply the user acts on a hidden
preference (a family of families.py; by default the task's, else concise): with probability
`explicit_rate` a thumbs vote (flipped with probability `noise`), otherwise only what the
user does (sessions.py): regenerate, a dissatisfied or satisfied follow-up, abandonment, or
carrying on; the session ends completed or abandoned. `profile` names the users
(sessions.PROFILES): `sparse` (the default), `realistic` (issue #41: 5% votes, partial implicit
signals, no follow_up sentiment and no task_success: the app sends what the Session says) or
`dense`. Apps with tools run them: the concise
app delivers the reply over an SMS tool that fails on a truncated or over-long message; the
tools family's app runs the model's calls and reports their real outcome. The gateway records
the served turns (token ids, behaviour logprobs, adapter version) and forwards the feedback,
so everything reaches Kafka the way production does.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from pipelines.adapters.version import label
from pipelines.contract.tool_calls import parse_tool_calls
from pipelines.deploy.service import GatewayClient
from pipelines.sim.families import Reply, family_for_task, reply_text
from pipelines.sim.sessions import Session, UserModel

SMS_LIMIT = 240  # characters the simulated concise app's SMS tool accepts


@dataclass
class TrafficConfig:
    tenant: str = "acme"
    task: str = "concise"
    requests: int = 96             # sessions (users) to run; each sends 1+ chat requests
    users: int = 16                # concurrent users (vLLM batches their requests)
    max_tokens: int = 48
    temperature: float = 1.0       # top_p 1, top_k off: the logged logprobs are the sampling distribution's
    split: str = "train"           # "heldout" prompts are the private eval's: never sent as traffic
    seed: int = 0
    turns_per_session: tuple[int, int] = (1, 3)  # inclusive (min, max) turns per session, drawn per user
    explicit_rate: float | None = None  # share of turns with a thumbs vote; None: the profile's (sparse 0.2,
                                   # realistic 0.05, dense 1.0); the others carry implicit signals only
    noise: float = 0.0             # probability a vote is flipped
    app: str = "sim"               # the app name the events carry
    profile: str = "sparse"        # the users (sessions.PROFILES): sparse (UserModel()), realistic, dense

    def __post_init__(self) -> None:
        self.turns_per_session = tuple(self.turns_per_session)  # type: ignore[assignment]  # JSON/TOML lists
        self.user_model()  # validates the three knobs, with their messages
        if self.split not in ("train", "heldout"):
            raise ValueError(f"split={self.split!r}; use 'train' (or 'heldout' for a deliberate leak test)")

    def user_model(self) -> UserModel:
        """The users of `profile`, with this config's turns_per_session, noise and explicit_rate (when
        set) in place of the profile's. `dense` keeps its own (1, 1) turns unless turns_per_session
        is changed from the default."""
        over: dict[str, Any] = {"noise": self.noise}
        if self.explicit_rate is not None:
            over["explicit_rate"] = self.explicit_rate
        if self.profile != "dense" or self.turns_per_session != (1, 3):
            over["turns_per_session"] = self.turns_per_session
        return UserModel.profile(self.profile, **over)


@dataclass
class TrafficStats:
    requests: int = 0              # sessions
    failed: int = 0                # sessions that hit an error
    turns: int = 0                 # chat requests served in the sessions that did not fail
    liked: int = 0                 # of those turns
    voted: int = 0                 # turns with an explicit vote
    abandoned: int = 0             # sessions
    started_at: float = 0.0        # wall clock of the first request
    ended_at: float = 0.0
    versions: dict[int, int] = field(default_factory=dict)   # adapter version -> turns served
    errors: list[str] = field(default_factory=list)

    @property
    def reward(self) -> float:
        """Share of replies the users liked: the live reward of this traffic."""
        return self.liked / max(1, self.turns)


@dataclass
class SessionResult:
    liked: list[bool]
    versions: list[int]
    voted: int
    outcome: str


def _sms(client: GatewayClient, trace: str, turn: str, reply: Reply, app: dict) -> None:
    fits = reply.finish_reason == "stop" and len(reply.text) <= SMS_LIMIT
    client.tool_call(trace, turn, "send_sms", "ok" if fits else "error", **app,
                     arguments={"chars": len(reply.text)},
                     error=None if fits else ("reply truncated" if reply.finish_reason != "stop"
                                              else f"over {SMS_LIMIT} chars"))


def one_user(client: GatewayClient, messages: list[dict], t: TrafficConfig, pref: Any, seed: int,
             pool: list[list[dict]] | None = None) -> SessionResult:
    """One session: ask, (deliver / run tools), react, maybe ask again; then end it."""
    rng = random.Random(seed)
    sess = Session.start(pool or [messages], messages, t.user_model(), rng)
    tools = list(getattr(pref, "tools", None) or ())
    choice = getattr(pref, "tool_choice", None)
    offer = {"tools": tools, **({"tool_choice": choice} if choice else {})} if tools else {}
    app = {"task": t.task, "app": t.app}
    trace: str | None = None
    liked, versions = [], []
    while not sess.done:
        ext: dict[str, Any] = {"app": t.app}
        if trace is not None:
            ext.update(trace_id=trace, turn_index=len(sess.turns))
        r = client.chat(t.task, sess.messages(), max_tokens=t.max_tokens, temperature=t.temperature, top_p=1.0,
                        top_k=-1, seed=seed + len(sess.turns), tracerl=ext, **offer)
        reply, meta = Reply.from_chat(r), r["tracerl"]
        trace, turn = meta["trace_id"], meta["turn_id"]
        ok = pref.liked(reply)
        rec = sess.observe(reply_text(reply), ok)
        if tools and hasattr(pref, "run_tool"):
            for call in parse_tool_calls(reply_text(reply)).calls:
                outcome, error = pref.run_tool(call)
                client.tool_call(trace, turn, call.name or "unparsed", outcome, **app, arguments=call.arguments,
                                 **({"error": error} if error else {}))
        elif getattr(pref, "name", "concise") == "concise":
            _sms(client, trace, turn, reply, app)
        for g in rec.signals:
            extra = {k: v for k, v in (("sentiment", g.sentiment), ("text", g.text)) if v is not None}
            client.feedback(trace, turn, g.kind, g.value, **app, **extra)
        liked.append(ok)
        versions.append(meta["adapter_version"])
    client.end(trace, sess.outcome, turns=len(sess.turns), **app,
               **({"task_success": sess.task_success} if sess.task_success is not None else {}))
    return SessionResult(liked, versions, sum(r.voted for r in sess.turns), sess.outcome)


def simulate(url: str, api_key: str, t: TrafficConfig, pref: Any = None,
             progress: Callable[[int, int], None] | None = None) -> TrafficStats:
    """Run `t.requests` sessions of users with preference `pref` (default: the task's family,
    else concise with 40 tokens) against the gateway at `url`."""
    pref = pref or family_for_task(t.task)
    pool = pref.prompts(t.split)
    later = list(pool)
    random.Random(t.seed).shuffle(pool)  # distinct prompts first, like many different users
    jobs = [(pool[i % len(pool)], t.seed * 100_003 + i) for i in range(t.requests)]
    client = GatewayClient(url, api_key)
    stats = TrafficStats(started_at=time.time())
    done = 0

    def run(job):
        try:
            return one_user(client, job[0], t, pref, job[1], later), None
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
                stats.turns += len(result.liked)
                stats.liked += sum(result.liked)
                stats.voted += result.voted
                stats.abandoned += result.outcome == "abandoned"
                for version in result.versions:
                    stats.versions[version] = stats.versions.get(version, 0) + 1
            if progress:
                progress(done, t.requests)
    stats.ended_at = time.time()
    return stats


def summary(stats: TrafficStats) -> str:
    served = ", ".join(f"{label(v)}: {n}" for v, n in sorted(stats.versions.items()))
    return (f"{stats.requests} sessions ({stats.turns} turns, {stats.voted} voted, {stats.abandoned} abandoned), "
            f"{stats.failed} failed, live reward {stats.reward:.3f} "
            f"(liked {stats.liked}); served by {served or 'none'}; "
            f"{stats.ended_at - stats.started_at:.0f}s")
