"""Kafka -> Parquet ingest against the real embedded broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from pipelines.contract.events import EVENT_TYPES
from pipelines.faults import EXIT_CODE
from pipelines.ingest.producer import DeliveryError, TraceProducer
from pipelines.ingest.run import IngestError, run_ingest
from pipelines.ingest.sample import bad_messages, generate
from pipelines.lake.query import connect
from pipelines.lake.store import Lake


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
    m = Lake(cfg.lake).latest()  # the watermarks now describe the new log only
    assert m.topic_ids == r2.topic_ids and max(m.watermarks.values()) < len(second) * 4
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


def _ingest_subprocess(cfg, failpoint: str | None):
    env = {**os.environ, "TRACERL_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers,
           "TRACERL_LAKE": str(cfg.lake), "TRACERL_HOME": str(cfg.home)}
    env.pop("TRACERL_FAILPOINT", None)
    if failpoint:
        env["TRACERL_FAILPOINT"] = failpoint
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "ingest", "--topic", cfg.kafka.topic,
                           "--group", cfg.kafka.group_id], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("point", ["ingest.after_stage", "ingest.after_manifest", "ingest.after_publish"])
def test_crash_then_rerun_is_exactly_once(cfg, point):
    events = generate(40, seed=21)
    bad = bad_messages(cfg.ingest.max_event_bytes)[:2]
    produce(cfg, events, raw=[(b"k", raw) for _, raw in bad])
    crashed = _ingest_subprocess(cfg, point)
    assert crashed.returncode == EXIT_CODE, crashed.stderr
    rerun = _ingest_subprocess(cfg, None)
    assert rerun.returncode == 0, rerun.stderr
    assert set(lake_payloads(cfg)) == {e.event_id for e in events}
    assert connect(cfg.lake).execute("SELECT count(*) FROM quarantine").fetchone()[0] == len(bad)
    assert not any((Lake(cfg.lake).staging).glob("*/**/*.parquet")), "staging left behind"
    assert run_ingest(cfg).consumed == 0  # Kafka offsets caught up with the lake


def test_two_consumers_in_one_group_land_exactly_once(cfg):
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
    while (r := run_ingest(cfg)).consumed:  # anything a rebalance left behind
        results.append(r)
    assert sum(r.landed for r in results) == len(events)
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
