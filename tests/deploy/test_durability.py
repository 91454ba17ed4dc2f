"""No acknowledged event is lost on the embedded (in-memory) broker: events Kafka acknowledged
and ingest had not read yet survive a broker kill -9 and a planned `tracerl down`/`up`, through
the emitter's journal, and land in the lake exactly once."""

from __future__ import annotations

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
