"""The gateway's emitter against a real broker that goes away and comes back: nothing is lost,
nothing blocks the caller, every spill and replay is counted, invalid events are quarantined."""

from __future__ import annotations

import json
import socket
import time
import uuid

import pytest

from pipelines.config import TracerlConfig
from pipelines.deploy.emitter import Emitter, EmitterConfig
from pipelines.ingest.sample import generate
from pipelines.services.kafka import start_broker, stop_broker

FAST = dict(max_block_ms=1000, request_timeout_ms=1000, bootstrap_timeout_ms=1000, reconnect_backoff_max_ms=200)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def events(n: int, seed: int = 0) -> list[dict]:
    return [e.to_dict() for e in generate(n, seed=seed)]


def consumed_ids(cfg: TracerlConfig, expect: int, timeout: float = 20.0) -> set[str]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(cfg.kafka.topic, bootstrap_servers=cfg.kafka.bootstrap_servers,
                             auto_offset_reset="earliest", group_id=None, consumer_timeout_ms=1000)
    ids: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(ids) < expect and time.monotonic() < deadline:
            for msg in consumer:
                ids.add(json.loads(msg.value)["event_id"])
    finally:
        consumer.close()
    return ids


def wait_for(pred, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_delivers_when_kafka_is_up(cfg, tmp_path):
    em = Emitter(cfg, tmp_path / "spill", EmitterConfig(replay_interval_s=0.5), **FAST)
    sent = events(20)
    for e in sent:
        em.emit(e)
    assert wait_for(lambda: em.stats()["sent"] == len(sent))
    em.close()
    assert consumed_ids(cfg, len(sent)) == {e["event_id"] for e in sent}
    s = em.stats()
    assert s["spilled_full"] == s["spilled_failed"] == s["replayed"] == s["rejected"] == 0


@pytest.mark.slow
def test_kafka_down_spills_to_disk_and_replays_when_it_returns(tmp_path):
    """Broker down: emit stays fast, the full queue and failed batches spill; broker back:
    the spill is replayed and every event arrives (duplicates allowed, losses not)."""
    own = TracerlConfig(home=tmp_path / "kafka")
    port = free_port()
    start_broker(own, port=port)
    cfg = TracerlConfig(home=tmp_path / "gw")
    cfg.kafka.bootstrap_servers = f"127.0.0.1:{port}"
    cfg.kafka.topic = own.kafka.topic = f"t-{uuid.uuid4().hex[:8]}"
    stop_broker(own)

    em = Emitter(cfg, tmp_path / "spill", EmitterConfig(queue_size=50, batch_size=50, delivery_timeout_s=2,
                                                         replay_interval_s=1, retry_backoff_s=0.5), **FAST)
    sent = events(60, seed=3)  # a few hundred events: more than the queue holds
    t0 = time.perf_counter()
    for e in sent:
        em.emit(e)
    emit_s = time.perf_counter() - t0
    assert emit_s < 1.0, f"emit blocked for {emit_s:.2f}s while Kafka was down"
    s = em.stats()
    assert s["spilled_full"] > 0 and s["emitted"] == len(sent)
    assert wait_for(lambda: em.stats()["spilled_full"] + em.stats()["spilled_failed"] == len(sent), 30), em.stats()
    assert em.stats()["kafka_errors"] > 0 and em.stats()["spill_files"] >= 1

    start_broker(own, port=port)  # back, empty (in-memory storage), topic re-created
    assert wait_for(lambda: em.stats()["replayed"] == len(sent), 60), em.stats()
    assert wait_for(lambda: em.stats()["spill_files"] == 0, 10)
    em.close()
    assert consumed_ids(cfg, len(sent)) == {e["event_id"] for e in sent}
    stop_broker(own)


def test_invalid_events_are_quarantined_with_their_reason_not_retried(cfg, tmp_path):
    em = Emitter(cfg, tmp_path / "spill", **FAST)
    good = events(2)
    bad = dict(good[0], event_id="bad", tenant="has spaces")
    for e in good + [bad]:
        em.emit(e)
    assert wait_for(lambda: em.stats()["sent"] + em.stats()["rejected"] == len(good) + 1)
    em.close()
    rows = [json.loads(line) for line in (tmp_path / "spill" / "rejected.jsonl").read_text().splitlines()]
    assert [r["event"]["event_id"] for r in rows] == ["bad"] and "tenant" in rows[0]["reason"]
    assert em.stats()["rejected"] == 1 and em.stats()["spill_files"] == 0


def test_spill_left_by_an_earlier_process_is_replayed(cfg, tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    old = events(3, seed=9)
    (spill / "spill-1-000000.jsonl").write_text("".join(json.dumps(e) + "\n" for e in old))
    em = Emitter(cfg, spill, EmitterConfig(replay_interval_s=0.3), **FAST)
    assert wait_for(lambda: em.stats()["replayed"] == len(old))
    em.close()
    assert consumed_ids(cfg, len(old)) >= {e["event_id"] for e in old}


def test_torn_and_garbled_spill_lines_are_moved_aside_and_the_rest_replayed(cfg, tmp_path):
    """A crash tore the last line of one spill file, the disk garbled a line in the middle of
    another: every good event still arrives, each bad line is in corrupt.jsonl with its file and
    line number, and the thread lives on."""
    spill = tmp_path / "spill"
    spill.mkdir()
    old = events(6, seed=11)
    a, b = old[:len(old) // 2], old[len(old) // 2:]
    torn = json.dumps(b[0])[:37]
    (spill / "spill-1-000000.jsonl").write_text("".join(json.dumps(e) + "\n" for e in a) + torn)
    garbage = "\x00\x01{not json" + "\n" + "[1, 2]"
    lines = [json.dumps(e) for e in b[1:]]
    (spill / "spill-2-000000.jsonl").write_bytes(
        ("\n".join(lines[:1] + [garbage] + lines[1:]) + "\n").encode() + b"\xff\xfe{\n")
    em = Emitter(cfg, spill, EmitterConfig(replay_interval_s=0.3), **FAST)
    want = len(a) + len(b) - 1  # b[0] is the torn line
    assert wait_for(lambda: em.stats()["replayed"] == want), em.stats()
    assert wait_for(lambda: em.stats()["spill_files"] == 0, 10)
    h = em.health()
    assert h["state"] == "running" and h["corrupt_lines"] == 4 and h["restarts"] == 0, h
    em.close()
    got = consumed_ids(cfg, want)
    assert got == {e["event_id"] for e in a + b[1:]}
    moved = [json.loads(line) for line in (spill / "corrupt.jsonl").read_text().splitlines()]
    assert sorted((m["file"], m["line"]) for m in moved) == [
        ("spill-1-000000.jsonl", len(a) + 1), ("spill-2-000000.jsonl", 2), ("spill-2-000000.jsonl", 3),
        ("spill-2-000000.jsonl", len(lines) + 3)]
    assert any(m["text"] == torn for m in moved) and all(m["reason"].startswith("spill:") for m in moved)


def test_the_thread_restarts_after_an_exception_and_loses_nothing(cfg, tmp_path, monkeypatch):
    """An exception inside the emitter's loop (injected while it holds a batch) spills that
    batch and restarts the thread with a backoff; health says so; delivery resumes."""
    em = Emitter(cfg, tmp_path / "spill", EmitterConfig(replay_interval_s=0.3, restart_backoff_s=0.1,
                                                        restart_backoff_max_s=0.4), **FAST)
    monkeypatch.setenv("TRACERL_FAULT", "emitter.batch")
    first = events(5, seed=21)
    for e in first:
        em.emit(e)
    assert wait_for(lambda: em.stats()["restarts"] >= 3), em.stats()
    h = em.health()
    assert h["state"] in ("running", "restarting") and "InjectedFault" in h["last_error"], h
    assert em.stats()["sent"] == 0 and em.stats()["spilled_failed"] >= 1
    monkeypatch.delenv("TRACERL_FAULT")
    later = events(5, seed=22)
    for e in later:
        em.emit(e)
    total = {e["event_id"] for e in first + later}
    assert wait_for(lambda: em.stats()["sent"] + em.stats()["replayed"] >= len(total)), em.stats()
    assert wait_for(lambda: em.health()["state"] == "running", 5)
    em.close()
    assert consumed_ids(cfg, len(total)) == total
    assert em.health()["state"] == "stopped"


def test_an_event_that_cannot_be_encoded_is_rejected_not_fatal(cfg, tmp_path):
    em = Emitter(cfg, tmp_path / "spill", EmitterConfig(queue_size=1), **FAST)
    deep: dict = {}
    node = deep
    for _ in range(100_000):
        node["x"] = node = {}
    good = events(2, seed=5)
    for e in [dict(good[0], extra=deep), *good]:
        em.emit(e)
    assert wait_for(lambda: em.stats()["sent"] + em.stats()["replayed"] >= len(good)), em.stats()
    assert wait_for(lambda: em.stats()["rejected"] == 1), em.stats()
    assert em.health()["state"] == "running" and em.stats()["restarts"] == 0
    em.close()
