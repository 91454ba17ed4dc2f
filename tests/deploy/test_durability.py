"""No acknowledged event is lost on the embedded (in-memory) broker: events Kafka acknowledged
and ingest had not read yet survive a broker kill -9 and a planned `tracerl down`/`up`, through
the emitter's journal, and land in the lake exactly once. And (issue #40) what is emitted while
Kafka is down is on disk before the emitter says it is done with it."""

from __future__ import annotations

import json
import os
import signal
import time

import pyarrow.dataset as ds
import pytest

from tests.conftest import make_config
from pipelines.config import TracerlConfig
from pipelines.deploy.emitter import Emitter, EmitterConfig
from pipelines.ingest.run import run_ingest
from pipelines.services import process
from pipelines.services.kafka import read_state, start_broker, stop_broker
from test_emitter import FAST, events, free_port, wait_for

FAST_JOURNAL = EmitterConfig(journal=True, journal_sweep_s=0.5, replay_interval_s=0.5, retry_backoff_s=0.5)


def lake_ids(cfg: TracerlConfig) -> list[str]:
    from pipelines.lake import delta

    _, files = delta.files(cfg.lake, delta.EVENTS)
    return ds.dataset(files, format="parquet").to_table(columns=["event_id"]).column("event_id").to_pylist() \
        if files else []


def kill_broker(own: TracerlConfig) -> None:
    """kill -9: no shutdown, the in-memory log is simply gone."""
    state = read_state(own)
    assert state is not None
    os.kill(state.pid, signal.SIGKILL)
    child = process._children.pop(state.pid, None)
    if child is not None:
        child.wait(10)
    assert wait_for(lambda: read_state(own) is None, 10)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill -9", "down/up"])
def test_acknowledged_events_survive_a_broker_restart(tmp_path, how):
    port = free_port()
    own = TracerlConfig(home=tmp_path / "kafka")
    cfg = make_config(tmp_path, f"127.0.0.1:{port}")
    cfg.ingest.decode_workers = 0
    own.kafka.topic = cfg.kafka.topic
    start_broker(own, port=port)
    spill = tmp_path / "spill"
    em = Emitter(cfg, spill, FAST_JOURNAL, **FAST)
    try:
        landed = events(10, seed=1)     # acknowledged and ingested before the restart
        waiting = events(15, seed=2)    # acknowledged, not ingested: what an in-memory broker loses
        t0 = time.perf_counter()
        for e in landed:
            em.emit(e)
        emit_us = (time.perf_counter() - t0) / len(landed) * 1e6
        assert wait_for(lambda: em.stats()["sent"] == len(landed)), em.stats()
        assert run_ingest(cfg).landed == len(landed)
        for e in waiting:
            em.emit(e)
        assert wait_for(lambda: em.stats()["sent"] == len(landed) + len(waiting)), em.stats()
        # the sweep forgets what the lake holds and keeps exactly what it does not
        assert wait_for(lambda: em.health()["journal_events"] == len(waiting), 15), em.health()
        h = em.health()
        per_event = h["journal_bytes"] / h["journal_events"]
        print(f"\n[{how}] emitted {len(landed) + len(waiting)}, acknowledged {em.stats()['sent']}, "
              f"ingested before the restart {len(landed)}; journal {per_event:.0f} B/event, "
              f"emit {emit_us:.1f} us/event")

        if how == "kill -9":
            kill_broker(own)
            start_broker(own, port=port)  # same port, empty, the topic created again (a new topic id)
        else:  # tracerl down stops the gateway before the broker, up starts the broker first
            em.close()
            stop_broker(own)
            start_broker(own, port=port)
            em = Emitter(cfg, spill, FAST_JOURNAL, **FAST)
        assert wait_for(lambda: em.stats()["resent"] == len(waiting), 30), (em.stats(), em.health())

        result = run_ingest(cfg)
        ids = lake_ids(cfg)
        print(f"[{how}] re-sent {em.stats()['resent']}, ingest after the restart landed {result.landed}, "
              f"lake holds {len(ids)} rows / {len(set(ids))} distinct of {len(landed) + len(waiting)}")
        assert sorted(ids) == sorted(e["event_id"] for e in landed + waiting)  # all of them, each once
        assert wait_for(lambda: em.health()["journal_events"] == 0, 15), em.health()
        assert em.health()["state"] == "running" and em.health()["journal_dropped"] == 0
    finally:
        em.close()
        stop_broker(own)


def test_journal_over_its_bound_drops_the_oldest_and_says_so(cfg, tmp_path):
    """A lake that never ingests cannot fill the gateway's disk: past journal_max_bytes the oldest
    segments go, counted, and health says the journal is over its bound."""
    bound = 4096
    em = Emitter(cfg, tmp_path / "spill", EmitterConfig(journal=True, journal_sweep_s=1.0, journal_max_bytes=bound),
                 **FAST)
    seen: list[dict] = []
    try:
        for seed in range(8):  # ~5 KB a round, never ingested
            for e in events(5, seed=40 + seed):
                em.emit(e)
            n = em.stats()["emitted"]
            assert wait_for(lambda: em.stats()["sent"] == n), em.stats()
            if wait_for(lambda: (h := em.health())["journal_over_bound"] and seen.append(h) is None, 0.6):
                break
        assert seen, em.health()
        h = seen[0]
        assert h["journal_dropped"] > 0 and h["journal_bytes"] <= bound + 64 * 1024, h
        assert em.health()["journal_events"] < em.stats()["journaled"]
    finally:
        em.close()


def test_a_torn_journal_line_is_moved_aside(cfg, tmp_path):
    """The gateway died mid-append: the next emitter keeps the whole lines, moves the torn one aside."""
    first = Emitter(cfg, tmp_path / "spill", EmitterConfig(journal=True, journal_sweep_s=0.3), **FAST)
    sent = events(3, seed=50)
    for e in sent:
        first.emit(e)
    assert wait_for(lambda: first.stats()["sent"] == len(sent))
    first.close()
    [segment] = sorted((tmp_path / "spill" / "journal").glob("journal-*.log"))
    whole = segment.read_text().splitlines()
    segment.write_text("\n".join(whole) + "\n" + whole[-1][:len(whole[-1]) // 2])
    second = Emitter(cfg, tmp_path / "spill", EmitterConfig(journal=True, journal_sweep_s=0.3), **FAST)
    try:
        h = second.health()
        assert h["corrupt_lines"] == 1 and h["journal_events"] == len(whole) and h["state"] == "running", h
    finally:
        second.close()
    assert "journal: torn line" in (tmp_path / "spill" / "corrupt.jsonl").read_text()


@pytest.mark.slow
def test_kafka_lost_events_are_on_disk_before_emit_says_done_and_share_fsyncs(tmp_path):
    """Issue #40: the broker dies. The emitter sees its connection close at once (not after a
    delivery timeout); from then on every emit hands back a future that is done only once the
    event is in an fsync'd spill segment, concurrent emits sharing fsyncs (group commit). The
    broker back, the spill is replayed and emit queues for Kafka again (no future)."""
    from concurrent.futures import ThreadPoolExecutor

    port = free_port()
    own = TracerlConfig(home=tmp_path / "kafka")
    cfg = make_config(tmp_path, f"127.0.0.1:{port}")
    own.kafka.topic = cfg.kafka.topic
    start_broker(own, port=port)
    em = Emitter(cfg, tmp_path / "spill", EmitterConfig(replay_interval_s=0.5, retry_backoff_s=0.5), **FAST)
    try:
        first = events(2, seed=60)
        assert [em.emit(e) for e in first] == [None] * len(first)  # Kafka up: queued, nobody waits
        assert wait_for(lambda: em.stats()["sent"] == len(first)), em.stats()
        kill_broker(own)
        t0 = time.monotonic()
        assert wait_for(lambda: em.health()["kafka_down"], 5), em.health()
        noticed = time.monotonic() - t0
        assert noticed < em.conf.durable_after_s, f"noticed after {noticed:.2f}s: by a timeout, not the connection"

        down = events(60, seed=61)
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:  # eight request handlers at once
            futures = list(pool.map(em.emit, down))
            assert all(f is not None for f in futures)
            for f in futures:
                f.result(timeout=10)
        waited = (time.monotonic() - t0) / len(down) * 1e6
        on_disk = {json.loads(line)["event_id"] for path in (tmp_path / "spill").glob("spill-*.jsonl")
                   for line in path.read_text().splitlines()}
        assert on_disk >= {e["event_id"] for e in down}
        s = em.stats()
        print(f"\nconnection loss noticed in {noticed * 1000:.0f} ms; {len(down)} events to disk in "
              f"{s['commits']} group commits, {waited:.0f} us/event")
        assert s["commits"] < len(down) and s["outages"] == 1

        start_broker(own, port=port)
        assert wait_for(lambda: not em.health()["kafka_down"], 30), (em.stats(), em.health())
        assert wait_for(lambda: em.stats()["replayed"] >= len(down) and em.stats()["spill_files"] == 0, 30), \
            em.stats()
        after = events(2, seed=62)
        assert [em.emit(e) for e in after] == [None] * len(after)
        assert wait_for(lambda: em.stats()["sent"] == len(first) + len(after)), em.stats()
    finally:
        em.close()
        stop_broker(own)
