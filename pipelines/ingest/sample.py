"""Realistic sample traffic from a few simulated customer apps.

Used by `tracerl produce-sample`, the demo, the tests and the ingest benchmark.
Traces have several turns, tool calls with every outcome, feedback of every
kind arriving minutes after the turn (and produced out of order), and a
session end. `bad_messages()` yields one message per quarantine reason.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone

from pipelines.contract.events import (
    Event, Feedback, Message, ModelTurn, Sampling, SessionEnd, ToolCall,
)

APPS = [  # (tenant, app, task, system prompt, tool)
    ("acme", "support-bot", "support", "You are Acme's support assistant.", "lookup_order"),
    ("acme", "sql-helper", "sql", "Write DuckDB SQL for the user's question.", "run_query"),
    ("globex", "code-assistant", "code", "You help with Python code.", "run_tests"),
]
USER = ["Where is my order {n}?", "Can I change the address on order {n}?", "How many users signed up in week {n}?",
        "Why does test_{n} fail?", "Refactor function f{n} to be pure.", "Cancel order {n}, please."]
ANSWERS = ["Your order {n} ships tomorrow.", "I have updated the address for order {n}.",
           "SELECT count(*) FROM users WHERE week = {n};", "The test fails because x{n} is None.",
           "Here is a pure version of f{n}: def f{n}(x): return x + 1", "Order {n} is cancelled."]
FOLLOW_UPS = [("that's wrong, try again", "dissatisfied"), ("thanks!", "satisfied"), ("and then?", "neutral")]


def _time(base: datetime, seconds: float) -> str:
    return (base + timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def generate_trace(rng: random.Random, base: datetime, adapter_version: int | None = None) -> list[Event]:
    tenant, app, task, system, tool = rng.choice(APPS)
    trace_id = f"tr-{rng.getrandbits(64):016x}"
    env = dict(tenant=tenant, app=app, trace_id=trace_id)
    messages = [Message(role="system", content=system)]
    events: list[Event] = []
    t = 0.0
    n_turns = rng.choice([1, 1, 2, 2, 3, 4])
    for i in range(n_turns):
        n = rng.randrange(1000)
        messages.append(Message(role="user", content=rng.choice(USER).format(n=n)))
        text = rng.choice(ANSWERS).format(n=n)
        n_tok = rng.randint(16, 160)
        turn = ModelTurn(
            **env, task=task, turn_index=i, model="SmolLM2-135M-Instruct", adapter_version=adapter_version,
            event_id=f"ev-{rng.getrandbits(64):016x}", turn_id=f"tu-{rng.getrandbits(64):016x}",
            event_time=_time(base, t), input_messages=list(messages), output_text=text,
            output_token_ids=[rng.randrange(49152) for _ in range(n_tok)],
            output_logprobs=[round(-rng.expovariate(2.0), 5) for _ in range(n_tok)],
            sampling=Sampling(temperature=0.7, top_p=1.0, top_k=0, max_tokens=256),
            finish_reason="stop", latency_ms=round(rng.uniform(80, 900), 1),
        )
        events.append(turn)
        messages.append(Message(role="assistant", content=text))
        if rng.random() < 0.4:
            outcome = rng.choices(["ok", "error", "timeout", "invalid_arguments"], [6, 2, 1, 1])[0]
            for attempt in range(1, (2 if outcome != "ok" and rng.random() < 0.5 else 1) + 1):
                events.append(ToolCall(
                    **env, task=task, turn_id=turn.turn_id, name=tool, arguments={"id": n},
                    call_id=f"ca-{rng.getrandbits(64):016x}",
                    event_id=f"ev-{rng.getrandbits(64):016x}", event_time=_time(base, t + 1 + attempt),
                    outcome=outcome if attempt == 1 else "ok", attempt=attempt,
                    error=None if outcome == "ok" or attempt > 1 else f"{tool} {outcome}",
                    latency_ms=round(rng.uniform(5, 3000), 1)))
        if rng.random() < 0.6:  # feedback arrives seconds to minutes later
            events.append(_feedback(rng, env, task, turn.turn_id, _time(base, t + rng.uniform(5, 600))))
        t += rng.uniform(10, 120)
    if rng.random() < 0.8:
        events.append(SessionEnd(**env, task=task, event_id=f"ev-{rng.getrandbits(64):016x}",
                                 event_time=_time(base, t + 30), turns=n_turns,
                                 outcome=rng.choice(["completed", "completed", "abandoned"]),
                                 task_success=rng.choice([True, True, False, None])))
    return events


def _feedback(rng: random.Random, env: dict, task: str, turn_id: str, when: str) -> Feedback:
    kind = rng.choice(["thumbs", "thumbs", "rating", "accept", "edit", "reject", "regenerate", "follow_up", "comment"])
    extra: dict = {}
    if kind == "thumbs":
        extra["value"] = rng.choice([1, -1])
    elif kind == "rating":
        extra.update(value=rng.randint(1, 5), scale_min=1, scale_max=5)
    elif kind == "edit":
        extra["text"] = "an edited answer"
    elif kind == "follow_up":
        extra["text"], extra["sentiment"] = rng.choice(FOLLOW_UPS)
    elif kind == "comment":
        extra["text"] = "free text from the user"
    return Feedback(**env, task=task, turn_id=turn_id, kind=kind, event_time=when,
                    event_id=f"ev-{rng.getrandbits(64):016x}", **extra)


def generate(n_traces: int, seed: int = 0, start: datetime | None = None) -> list[Event]:
    """Events of `n_traces` traces in arrival order: interleaved, feedback late and out of order."""
    rng = random.Random(seed)
    start = start or datetime.now(timezone.utc) - timedelta(hours=1)
    events = []
    for i in range(n_traces):
        events.extend(generate_trace(rng, start + timedelta(seconds=i * 0.5)))
    # Arrival order: by event time, with jitter, so late feedback lands after later traces' turns.
    return sorted(events, key=lambda e: e.event_time + f"{rng.random():.3f}")


def bad_messages(max_bytes: int = 1 << 20) -> list[tuple[str, bytes]]:
    """(expected quarantine reason, raw value): one of every class ingest must catch."""
    good = generate(1, seed=7)[0].to_dict()

    def variant(**changes) -> bytes:
        d = dict(good)
        for k, v in changes.items():
            if v is _DROP:
                d.pop(k)
            else:
                d[k] = v
        return json.dumps(d).encode()

    return [
        ("not_json", b"{this is not json"),
        ("not_json", b"\xff\xfe binary garbage"),
        ("not_object", b"[1, 2, 3]"),
        ("unknown_schema_version", variant(schema_version=99)),
        ("unknown_event_type", variant(type="page_view")),
        ("missing_field", variant(trace_id=_DROP)),
        ("wrong_type", variant(tenant=42)),
        ("oversize", variant(output_text="x" * (max_bytes + 1))),
        ("invalid_value", variant(event_time="yesterday")),
    ]


_DROP = object()
