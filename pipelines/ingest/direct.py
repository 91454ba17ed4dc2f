"""Contract events straight into the lake, as an ingest run stores them, without Kafka.

For what has its events in hand and no broker to go through: the offline simulator
(pipelines/sim/offline.py, its benchmarks and proofs) and tests. Production traffic always comes
through Kafka and `run.py` (exactly once, quarantine, watermarks); this writes one Delta commit
with no watermark, so it must never be mixed into a topic's offsets.

Like ingest, it never stores a user id in clear: an event's `user` that is not a pseudonym is
pseudonymized with the tenant's secret under ``home``, or refused without one.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from pipelines.contract.events import Event
from pipelines.contract.validate import parse_time
from pipelines.ingest.decode import hot_fields
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS
from pipelines.lake.tables import EVENTS_SCHEMA, Columns
from pipelines.privacy.pseudonym import is_pseudonym, pseudonym

STORED_EVENTS = EVENTS_SCHEMA.append(pa.field("tenant", pa.string())).append(pa.field("date", pa.string()))


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def events_table(events: list[Event], ingested_at: datetime | None = None, run_id: str = "direct",
                 topic: str = "direct", home: Path | str | None = None) -> pa.Table:
    """`events` as ingest stores them: the events columns (`topic` in place of a Kafka topic, partition
    0, offsets 0..n-1) and the tenant and date partitions. ``home``: the tenants' pseudonym secrets,
    for events whose `user` is a clear id (ValueError without it)."""
    ing = _ms(ingested_at or datetime.now(timezone.utc))
    groups: dict[tuple[str, str], Columns] = defaultdict(lambda: Columns(EVENTS_SCHEMA))
    for i, e in enumerate(events):
        d = e.to_dict()
        user = d.get("user")
        if user is not None and not is_pseudonym(user):
            if home is None:
                raise ValueError(f"event {d['event_id']} names a user in clear: pass `home` (its tenant's secret "
                                 "pseudonymizes it) or a pseudonym (pipelines.privacy.pseudonym)")
            d["user"] = pseudonym(home, d["tenant"], user)
        t = parse_time(d["event_time"]).astimezone(timezone.utc)
        c = groups[(d["tenant"], t.date().isoformat())]
        for name, v in zip(EVENTS_SCHEMA.names, (
                d["event_id"], d["type"], d["schema_version"], d["app"], d.get("task"), d["trace_id"],
                d.get("turn_id"), _ms(t), json.dumps(d), topic, 0, i, ing, run_id, *hot_fields(d))):
            c.cols[name].append(v)
    parts = [c.table().append_column("tenant", pa.array([tenant] * len(c))).append_column("date", pa.array([day] * len(c)))
             for (tenant, day), c in groups.items()]
    return pa.concat_tables(parts) if parts else STORED_EVENTS.empty_table()


def land(root: Path | str, events: list[Event], ingested_at: datetime | None = None, topic: str = "direct",
         home: Path | str | None = None) -> str:
    """Commit `events` to the lake at `root` as one ingest-like run (one Delta commit); its run id."""
    run_id = f"{topic}-" + uuid.uuid4().hex[:8]
    delta.append(root, EVENTS, events_table(events, ingested_at, run_id, topic, home))
    return run_id
