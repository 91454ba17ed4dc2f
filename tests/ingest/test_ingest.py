"""Kafka -> Parquet ingest against the real embedded broker."""

from __future__ import annotations

import dataclasses
import json
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.contract.events import EVENT_TYPES
from pipelines.ingest.decode import Chunk, Decoder
from pipelines.ingest.producer import DeliveryError, TraceProducer
from pipelines.contract.validate import INTERNAL_ERROR
from pipelines.ingest.run import IngestError, _first_occurrences, run_ingest
from pipelines.ingest.sample import bad_messages, generate
from pipelines.lake.query import connect
from pipelines.lake import delta
from tests.ingest.poison import poison_decoder, poisoned


def produce(cfg, events=(), raw=()):
    with TraceProducer(cfg) as p:
        for e in events:
            p.send(e)
        for key, value in raw:
            p.send_raw(key, value)


def lake_payloads(cfg) -> dict[str, dict]:
    rows = connect(cfg.lake).sql("SELECT event_id, payload FROM events").fetchall()
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)), "an event landed twice"
    return {eid: json.loads(p) for eid, p in rows}


def test_round_trip_of_every_event_type(cfg):
    events = generate(60, seed=11)
    produce(cfg, events)
    r = run_ingest(cfg)
    assert (r.landed, r.quarantined, r.kafka_commit) == (len(events), 0, "ok")
    landed = lake_payloads(cfg)
    sent = {e.event_id: e.to_dict() for e in events}
    assert landed == sent  # byte-for-byte the same JSON objects, every type
    con = connect(cfg.lake)
    counts = dict(con.sql("SELECT type, count(*) FROM events GROUP BY ALL").fetchall())
    assert set(counts) == set(EVENT_TYPES)
    for view, etype in [("turns", "model_turn"), ("tool_calls", "tool_call"),
                        ("feedback", "feedback"), ("session_ends", "session_end")]:
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone()[0] == counts[etype]
    turn = next(e for e in events if e.type == "model_turn")
    ids, lps, tenant = con.execute(
        "SELECT output_token_ids, output_logprobs, tenant FROM turns WHERE turn_id = ?", [turn.turn_id]).fetchone()
    assert (ids, lps, tenant) == (turn.output_token_ids, turn.output_logprobs, turn.tenant)


def test_second_run_lands_only_new_events_consumer_group_resume(cfg):
    first, second = generate(30, seed=1), generate(30, seed=2)
    produce(cfg, first)
    assert run_ingest(cfg).landed == len(first)
    assert run_ingest(cfg).consumed == 0
    produce(cfg, second)
    r = run_ingest(cfg)
    assert r.landed == len(second) and r.already_landed == 0
    assert set(lake_payloads(cfg)) == {e.event_id for e in first + second}


def test_a_recreated_topic_is_read_from_its_start(cfg):
    """Offsets start over when a topic is deleted and created again (or an in-memory broker
    restarts): the lake's watermarks of the old log must not hide the new one's events."""
    from kafka import KafkaAdminClient

    from pipelines.services.kafka import client_options, ensure_topic

    first = generate(40, seed=3)
    produce(cfg, first)
    r1 = run_ingest(cfg)
    assert r1.landed == len(first) and r1.topic_ids  # the broker reports a topic id
    admin = KafkaAdminClient(**client_options(cfg))
    admin.delete_topics([cfg.kafka.topic])
    admin.close()
    ensure_topic(cfg)
    second = generate(10, seed=4)  # far fewer events: their offsets are all below the old watermarks
    produce(cfg, second)
    r2 = run_ingest(cfg)
    assert r2.topic_ids != r1.topic_ids
    assert r2.landed == len(second) and r2.already_landed == 0
    assert set(lake_payloads(cfg)) == {e.event_id for e in first + second}
    topic = cfg.kafka.topic  # each log keeps its own watermarks, under its topic id
    new = delta.landed(cfg.lake, [(topic, r2.topic_ids[topic], p) for p in range(8)])
    old = delta.landed(cfg.lake, [(topic, r1.topic_ids[topic], p) for p in range(8)])
    assert new and max(new.values()) < len(second) and max(old.values()) > max(new.values())
    assert run_ingest(cfg).consumed == 0  # and the next run resumes after it


def test_bounded_batches_resume_where_the_last_stopped(cfg):
    events = generate(50, seed=5)
    produce(cfg, events)
    landed = 0
    for _ in range(20):
        r = run_ingest(cfg, max_events=70)
        assert r.consumed <= 70
        landed += r.landed
        if r.consumed == 0:
            break
    assert landed == len(events)
    assert set(lake_payloads(cfg)) == {e.event_id for e in events}


def test_duplicate_produce_is_one_row(cfg):
    events = generate(10, seed=4)
    produce(cfg, events + events[:5])
    r = run_ingest(cfg)
    assert (r.landed, r.duplicates) == (len(events), 5)
    produce(cfg, events[5:8])  # a retry that arrives in a later run
    r = run_ingest(cfg)
    assert (r.landed, r.duplicates) == (0, 3)
    assert len(lake_payloads(cfg)) == len(events)


def test_the_same_event_id_in_two_tenants_is_two_events(cfg):
    """Dedupe is per tenant: B reusing A's event ids (by accident or on purpose) hides none of A's events."""
    acme = [e for e in generate(10, seed=12) if e.tenant == "acme"]
    other = [dataclasses.replace(e, tenant="initech") for e in acme]  # same event_id, another tenant
    produce(cfg, [x for pair in zip(acme, other) for x in pair])  # interleaved: one batch, one chunk
    r = run_ingest(cfg)
    assert (r.landed, r.duplicates) == (2 * len(acme), 0)
    produce(cfg, acme[:3] + other[:3])  # each tenant's own retry is still one row
    r = run_ingest(cfg)
    assert (r.landed, r.duplicates) == (0, 6)
    rows = connect(cfg.lake).sql("SELECT tenant, event_id FROM events").fetchall()
    assert sorted(rows) == sorted((e.tenant, e.event_id) for e in acme + other)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from(["e1", "e2", "e3"])), max_size=30))
def test_batch_dedupe_keeps_the_first_of_each_tenant_and_id(pairs):
    table = pa.table({"tenant": [t for t, _ in pairs], "event_id": [e for _, e in pairs],
                      "n": list(range(len(pairs)))}, schema=pa.schema(
        [("tenant", pa.string()), ("event_id", pa.string()), ("n", pa.int64())]))
    kept = _first_occurrences(table, ["tenant", "event_id"]).column("n").to_pylist()
    seen: set = set()
    expected = [i for i, p in enumerate(pairs) if not (p in seen or seen.add(p))]
    assert kept == expected  # keep-first, in Kafka order


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), data=st.data())
def test_isolation_quarantines_exactly_the_messages_that_raise(monkeypatch, n, data):
    poison_decoder(monkeypatch)
    events = generate(12, seed=n)[:n]
    n = len(events)
    poison = data.draw(st.sets(st.integers(0, n - 1)))
    values = [poisoned(e) if i in poison else json.dumps(e.to_dict()).encode() for i, e in enumerate(events)]
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, n - 1)), max_size=4)) | {0, n})
    decoder = Decoder(1 << 20, 0, "run", 1)
    for lo, hi in zip(cuts, cuts[1:]):
        decoder.submit(Chunk("t", lo % 3, lo, list(range(lo, hi)), [1] * (hi - lo), [None] * (hi - lo),
                             values[lo:hi]))
    landed, quarantined = decoder.results()
    assert sorted(landed.column("row").to_pylist()) == sorted(set(range(n)) - poison)
    assert sorted(quarantined.column("row").to_pylist()) == sorted(poison)
    assert set(quarantined.column("reason").to_pylist()) <= {INTERNAL_ERROR}
    assert quarantined.column("raw_value").to_pylist() == [values[i] for i in sorted(poison)]
    assert (decoder.failure is None) == (not poison)


def test_a_message_that_makes_decode_raise_is_isolated_and_the_stream_moves_on(cfg, monkeypatch):
    poison_decoder(monkeypatch)
    events = generate(20, seed=13)
    bad = events[::7]
    produce(cfg, [e for e in events if e not in bad], raw=[(b"k", poisoned(e)) for e in bad])
    r = run_ingest(cfg)
    assert (r.landed, r.quarantined, r.reasons, r.kafka_commit) == (
        len(events) - len(bad), len(bad), {INTERNAL_ERROR: len(bad)}, "ok")
    assert "RecursionError" in r.isolated
    rows = connect(cfg.lake).sql("SELECT reason, error, raw_value FROM quarantine").fetchall()
    assert sorted(raw for _, _, raw in rows) == sorted(poisoned(e) for e in bad)
    assert all(err.startswith(INTERNAL_ERROR) and "RecursionError" in err for _, err, _ in rows)
    later = generate(5, seed=14)
    produce(cfg, later)
    r = run_ingest(cfg)  # nothing replays, nothing is blocked
    assert (r.consumed, r.landed, r.quarantined) == (len(later), len(later), 0)


def test_every_bad_input_class_is_quarantined_with_raw_bytes(cfg):
    bad = bad_messages(cfg.ingest.max_event_bytes)
    good = generate(5, seed=9)
    produce(cfg, good[:3], raw=[(b"k", raw) for _, raw in bad])
    produce(cfg, good[3:])  # bad messages never block what comes after them
    r = run_ingest(cfg)
    assert r.landed == len(good)
    assert r.quarantined == len(bad)
    rows = connect(cfg.lake).sql(
        "SELECT reason, raw_value, error, kafka_topic, kafka_partition, kafka_offset, quarantined_at "
        "FROM quarantine").fetchall()
    assert sorted(row[0] for row in rows) == sorted(reason for reason, _ in bad)
    assert sorted(row[1] for row in rows) == sorted(raw for _, raw in bad)
    for reason, _, error, topic, part, offset, at in rows:
        assert error.startswith(reason) and topic == cfg.kafka.topic and offset >= 0 and at is not None
    assert run_ingest(cfg).consumed == 0  # committed past them, counted once


def test_newer_producer_field_survives_ingest(cfg):
    e = generate(1, seed=3)[0].to_dict() | {"client_region": "eu-west-1"}
    produce(cfg, [e])
    run_ingest(cfg)
    assert lake_payloads(cfg)[e["event_id"]]["client_region"] == "eu-west-1"


def test_two_ingests_at_once_land_exactly_once(cfg):
    events = generate(300, seed=8)
    produce(cfg, events)
    results = []

    def consume():
        results.append(run_ingest(cfg, max_events=len(events)))

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert run_ingest(cfg).consumed == 0  # nothing left behind
    assert sum(r.landed for r in results) == len(events)  # the loser of a commit landed only what was new
    assert set(lake_payloads(cfg)) == {e.event_id for e in events}


def test_missing_topic_is_a_clear_error(cfg):
    with pytest.raises(IngestError, match="does not exist"):
        run_ingest(cfg, topic="no-such-topic")


def test_delivery_errors_reach_the_caller(tmp_path):
    """A broker that goes away: failures reach on_error and flush() raises, nothing is silent."""
    from pipelines.config import TracerlConfig
    from pipelines.services.kafka import start_broker, stop_broker

    own = TracerlConfig(home=tmp_path)
    own.kafka.embedded_port = 0 or 29092
    state = start_broker(own)
    failures = []
    p = TraceProducer(own, on_error=lambda label, err: failures.append(label),
                      max_block_ms=3000, request_timeout_ms=1000, delivery_timeout_ms=3000,
                      reconnect_backoff_max_ms=200)
    p.send(generate(1)[0]).get(timeout=10)  # delivered while the broker is up
    stop_broker(own)
    events = generate(2, seed=5)
    for e in events:
        p.send(e)
    with pytest.raises(DeliveryError, match="not delivered") as err:
        p.flush(timeout=20)
    assert {label for label, _ in err.value.failures} == {e.event_id for e in events} == set(failures)
    assert state.pid  # the broker we stopped was our own, not the session's
