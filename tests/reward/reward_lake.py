"""Test helpers: land contract events straight into a lake (no Kafka), as ingest would."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa

from pipelines.contract.events import Event, Feedback, Message, ModelTurn, SessionEnd, ToolCall
from pipelines.contract.validate import parse_time
from pipelines.ingest.decode import hot_fields
from pipelines.lake.tables import EVENTS_SCHEMA, Columns
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def events_table(events: list[Event], ingested_at: datetime | None = None, run_id: str = "test") -> pa.Table:
    """`events` as ingest stores them: the events columns and the tenant and date partitions."""
    ing = ms(ingested_at or datetime.now(timezone.utc))
    groups: dict[tuple[str, str], Columns] = defaultdict(lambda: Columns(EVENTS_SCHEMA))
    for i, e in enumerate(events):
        d = e.to_dict()
        t = parse_time(d["event_time"]).astimezone(timezone.utc)
        c = groups[(d["tenant"], t.date().isoformat())]
        for name, v in zip(EVENTS_SCHEMA.names, (
                d["event_id"], d["type"], d["schema_version"], d["app"], d.get("task"), d["trace_id"],
                d.get("turn_id"), ms(t), json.dumps(d), "test", 0, i, ing, run_id, *hot_fields(d))):
            c.cols[name].append(v)
    parts = [c.table().append_column("tenant", pa.array([tenant] * len(c))).append_column("date", pa.array([day] * len(c)))
             for (tenant, day), c in groups.items()]
    return pa.concat_tables(parts) if parts else STORED_EVENTS.empty_table()


STORED_EVENTS = EVENTS_SCHEMA.append(pa.field("tenant", pa.string())).append(pa.field("date", pa.string()))


def land(root: Path, events: list[Event], ingested_at: datetime | None = None) -> str:
    """Commit `events` to the lake at `root` as one ingest-like run (one Delta commit); its run id."""
    run_id = "test-" + uuid.uuid4().hex[:8]
    delta.append(root, EVENTS, events_table(events, ingested_at, run_id))
    return run_id


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

