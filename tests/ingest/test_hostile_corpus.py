"""The hostile corpus through the real broker and the real `run_ingest`: nothing blocks the stream.

Every class of `hostile.corpus()` (plus random bytes, a 10 MB message, NaN/Infinity, deep
nesting, a tombstone) is produced to Kafka between valid events of two other tenants; ingest must
land every valid event exactly once, quarantine every hostile one with the reason that names its
problem, keep every view (and the reward stage) readable, and land later events in a later run.
"""

from __future__ import annotations

import json

from pipelines.ingest.producer import TraceProducer
from pipelines.ingest.run import run_ingest
from pipelines.ingest.sample import generate
from pipelines.lake.query import connect
from pipelines.reward.engine import run_rewards
from tests.ingest.hostile import TENANT, corpus, query_views

BIG = 12 << 20  # room for the 10 MB message at the producer (ingest quarantines it as oversize)


def produce(cfg, valid, cases) -> None:
    """Valid events and hostile messages interleaved, the hostile ones spread over all partitions."""
    with TraceProducer(cfg, max_request_size=BIG) as p:
        for i in range(max(len(valid), len(cases))):
            if i < len(valid):
                p.send(valid[i])
            if i < len(cases):
                p.send_raw(f"{TENANT}-{i}".encode(), cases[i].raw, cases[i].name)


def test_hostile_corpus_through_kafka_quarantines_each_class_and_never_blocks(cfg):
    cases = corpus(cfg.ingest.max_event_bytes, seed=1)
    first, later = generate(40, seed=21), generate(20, seed=22)
    assert {e.tenant for e in first} == {"acme", "globex"}
    produce(cfg, first, cases)
    r1 = run_ingest(cfg)
    bad = [c for c in cases if c.reason]
    assert r1.consumed == len(first) + len(cases)
    assert (r1.landed, r1.quarantined, r1.duplicates) == (len(first) + len(cases) - len(bad), len(bad), 0)
    assert "internal_error" not in r1.reasons

    con = connect(cfg.lake)
    rows = con.execute("SELECT raw_value, reason, error FROM quarantine").fetchall()
    by_raw = {raw: (reason, error) for raw, reason, error in rows}
    assert len(by_raw) == len(bad)
    for case in bad:
        reason, error = by_raw[case.raw]
        assert reason == case.reason and case.needle in error, (case.name, reason, error)
    landed = dict(con.execute("SELECT event_id, tenant FROM events").fetchall())
    assert len(landed) == r1.landed  # each event once
    assert {e.event_id for e in first} <= set(landed)
    assert sum(t == TENANT for t in landed.values()) == len(cases) - len(bad)  # the normalised classes

    produce(cfg, later, corpus(cfg.ingest.max_event_bytes, seed=2)[-8:])  # more random bytes after them
    r2 = run_ingest(cfg)
    assert (r2.landed, r2.quarantined, r2.already_landed) == (len(later), 8, 0)
    assert {e.event_id for e in later} <= {eid for (eid,) in connect(cfg.lake).execute(
        "SELECT event_id FROM events").fetchall()}

    counts = query_views(cfg.lake)  # every view reads every landed row, strictly too
    assert counts["events"] == r1.landed + r2.landed and counts["quarantine"] == len(bad) + 8
    run_rewards(cfg.lake)  # the reward stage reads what landed
    assert query_views(cfg.lake)["rewards"] > 0
    turn = json.loads(connect(cfg.lake).execute(
        "SELECT payload FROM turns WHERE tenant = ? AND output_text LIKE 'a%b%'", [TENANT]).fetchone()[0])
    assert turn["output_text"] == "a\x00b\x1f"  # control characters land as sent
    served = connect(cfg.lake).execute("SELECT schema_version, typeof(adapter_version), adapter_version FROM turns "
                                       "JOIN events USING (event_id) WHERE turns.tenant = ? AND adapter_version "
                                       "IS NOT NULL ORDER BY ALL", [TENANT]).fetchall()
    # the lake's version is the int: as a v2 producer sent it, or read from a v1 producer's "v4" / "4";
    # a v2 "v3" never landed
    assert served == [(1, "BIGINT", 4), (1, "BIGINT", 4), (1, "BIGINT", 5), (2, "BIGINT", 3)]


def test_a_topic_mapped_to_one_tenant_quarantines_events_claiming_another(cfg):
    """A direct producer on acme's topic cannot write globex's events (`ingest.topic_tenants`)."""
    cfg.ingest.topic_tenants = {cfg.kafka.topic: "acme"}
    events = generate(30, seed=23)
    acme = [e for e in events if e.tenant == "acme"]
    assert acme and len(acme) < len(events)
    with TraceProducer(cfg) as p:
        for e in events:
            p.send(e)
    r = run_ingest(cfg)
    assert (r.landed, r.quarantined, r.reasons) == (len(acme), len(events) - len(acme),
                                                    {"tenant_mismatch": len(events) - len(acme)})
    con = connect(cfg.lake)
    assert {t for (t,) in con.execute("SELECT DISTINCT tenant FROM events").fetchall()} == {"acme"}
    assert all("globex" in err for (err,) in con.execute("SELECT error FROM quarantine").fetchall())
