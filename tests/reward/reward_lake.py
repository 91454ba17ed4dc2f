"""Test helpers: land contract events straight into a lake (no Kafka), as ingest would."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa

from pipelines.contract.events import Event, Feedback, Message, ModelTurn, SessionEnd, ToolCall
from pipelines.ingest import direct

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def events_table(events: list[Event], ingested_at: datetime | None = None, run_id: str = "test") -> pa.Table:
    """`events` as ingest stores them (pipelines/ingest/direct.py)."""
    return direct.events_table(events, ingested_at, run_id, topic="test")


STORED_EVENTS = direct.STORED_EVENTS


def land(root: Path, events: list[Event], ingested_at: datetime | None = None) -> str:
    """Commit `events` to the lake at `root` as one ingest-like run (one Delta commit); its run id."""
    return direct.land(root, events, ingested_at, topic="test")


ENV = dict(tenant="acme", app="bot", task="support", trace_id="tr-1")


def turn(turn_id: str, index: int = 0, t: float = 0, text: str = "Here is the answer.",
         latency_ms: float | None = None, user: str | None = None, **kw) -> ModelTurn:
    """A model turn; `user`: its request's user message (default: the turn id, so that consecutive
    turns read as moving on to a new topic, which the default spec does not score: no hindsight)."""
    env = {**ENV, **kw}
    return ModelTurn(**env, turn_id=turn_id, turn_index=index, event_time=at(t), model="m",
                     input_messages=[Message(role="user", content=turn_id if user is None else user)],
                     output_text=text,
                     latency_ms=latency_ms)


def fb(turn_id: str, kind: str, t: float = 10, **kw) -> Feedback:
    env = {**ENV, **{k: kw.pop(k) for k in list(kw) if k in ENV}}
    return Feedback(**env, turn_id=turn_id, kind=kind, event_time=at(t), **kw)


def tool(turn_id: str, outcome: str, t: float = 1, attempt: int = 1, **kw) -> ToolCall:
    env = {**ENV, **{k: kw.pop(k) for k in list(kw) if k in ENV}}
    return ToolCall(**env, turn_id=turn_id, name="lookup", outcome=outcome, attempt=attempt, event_time=at(t), **kw)


def end(t: float, outcome: str = "completed", success: bool | None = None, **kw) -> SessionEnd:
    env = {**ENV, **kw}
    return SessionEnd(**env, outcome=outcome, task_success=success, event_time=at(t))

