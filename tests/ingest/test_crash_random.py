"""Kill -9 of `tracerl ingest` at random times, over runs whose batches differ: every valid event lands
exactly once and every bad message is in the quarantine exactly once (issue #40 point 5).

`test_crash.py` kills one run, then drains the topic in one big batch, which covers every offset the
killed run decided on. Here each run takes a small batch (`--max-events`), so the run after a crash
reads a different slice of each partition than the crashed one did; a kill that lands between the
quarantine commit and the events commit (the quarantine's watermarks ahead of the events'), then a
run that quarantines in one partition while reading less of another than the crashed run did, is the
case that once put a bad message in the quarantine twice (the quarantine's watermark of the partition
read less went back to where that run stopped, and the next run quarantined the rest again).

The kill times come from a seeded RNG: a wall-clock time after start, or a few milliseconds after a
commit of the quarantine table appears (the window between the two commits lasts ~10-20 ms of a ~3 s
run: a uniform wall-clock kill hits it too rarely for a test). `TRACERL_KILL_SEED` and
`TRACERL_KILL_ROUNDS` override the seed and the number of kills, for a longer soak."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pipelines.ingest.producer import TraceProducer
from pipelines.ingest.run import run_ingest
from pipelines.ingest.sample import bad_messages, generate
from pipelines.lake.delta import EVENTS, QUARANTINE
from pipelines.lake.query import connect
from tests.ingest.test_crash import MARK, tables_toml, tagged, wait_gone

BATCH = 150  # the scale of a run's --max-events (each drawn below it): the run after a crash reads other slices


def hostile(max_bytes: int, n: int) -> list[bytes]:
    """``n`` distinct bad messages of every class `bad_messages` has."""
    classes = [raw for _, raw in bad_messages(max_bytes)]
    out = []
    for i in range(n):
        raw = classes[i % len(classes)]
        if raw.startswith(b"{") and raw.endswith(b"}"):
            raw = raw[:-1] + f', "_n": {i}}}'.encode()  # still what made it bad, now unique
        else:
            raw = raw + f" #{i}".encode()
        out.append(raw)
    return out


def produce_spread(cfg, good, bad) -> None:
    """The good events with the bad messages among them, each bad one keyed by its bytes (all partitions)."""
    step = len(good) // len(bad)
    with TraceProducer(cfg) as p:
        for i, e in enumerate(good):
            p.send(e)
            if i % step == 0 and i // step < len(bad):
                raw = bad[i // step]
                p.send_raw(hashlib.sha1(raw).hexdigest().encode(), raw)


def start(cfg, tmp_path: Path, tag: str, max_events: int) -> subprocess.Popen:
    """`tracerl ingest --max-events` with decode workers, in a consumer group of its own (a killed
    member would hold the group's partitions until its session times out; the lake's watermarks,
    not the group's offsets, say where each run starts)."""
    toml = tmp_path / "kill.toml"
    toml.write_text(f'[ingest]\ndecode_workers = 2\ndecode_parallel_from = 40\nidle_seconds = 0.5\n'
                    f'max_event_bytes = {cfg.ingest.max_event_bytes}\n' + tables_toml(cfg))
    env = {**os.environ, "TRACERL_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers, "TRACERL_LAKE": str(cfg.lake),
           "TRACERL_HOME": str(cfg.home), "TRACERL_CONFIG": str(toml), MARK: tag, "PYTHONFAULTHANDLER": "1"}
    env.pop("TRACERL_FAILPOINT", None)
    env.pop("TRACERL_PAUSE", None)
    with open(tmp_path / "ingest.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "tracerl.cli", "ingest", "--topic", cfg.kafka.topic,
                                 "--group", f"kill-{uuid.uuid4().hex[:8]}", "--max-events", str(max_events)],
                                env=env, stdout=log, stderr=subprocess.STDOUT)


def commits(log: Path) -> int:
    try:
        return sum(1 for f in os.listdir(log) if f.endswith(".json"))
    except FileNotFoundError:
        return 0


def kill_at_random(proc: subprocess.Popen, rng: random.Random, lake) -> str:
    """SIGKILL ``proc`` at a time drawn from ``rng``; what it drew and hit (the process may end first)."""
    logs = {t: Path(lake.table_uri(t)) / "_delta_log" for t in (QUARANTINE, EVENTS)} if lake.local else None
    before = {t: commits(log) for t, log in (logs or {}).items()}
    if logs and rng.random() < 0.75:  # the window between the two commits: ~10-20 ms of a ~3 s run
        delay = rng.uniform(0.0, 0.015)
        deadline = time.monotonic() + 60
        while proc.poll() is None and commits(logs[QUARANTINE]) == before[QUARANTINE] \
                and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        how = f"{delay * 1000:.0f} ms after a quarantine commit"
    else:
        delay = rng.uniform(0.3, 4.0)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            pass
        how = f"{delay:.2f} s after start"
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.returncode != -signal.SIGKILL:
        how += f" (ended first: rc {proc.returncode})"
    elif logs and commits(logs[QUARANTINE]) > before[QUARANTINE] and commits(logs[EVENTS]) == before[EVENTS]:
        how += " (between the commits)"
    return how


def watermark_keys(table: Path) -> set[str]:
    """Every application transaction id the table's log ever committed."""
    keys = set()
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn:
                keys.add(txn["appId"])
    return keys


def kill_rounds_then_drain(cfg, tmp_path, seed: int, rounds: int, n_good_traces: int, n_bad: int) -> list[str]:
    """``rounds`` times: produce a slice of the traffic, start an ingest of a random batch size and kill it
    at a random time, then let one ingest of another random size run; then drain, and check the lake."""
    rng = random.Random(seed)
    good = generate(n_good_traces, seed=1000 + seed)
    bad = hostile(cfg.ingest.max_event_bytes, n_bad)
    drew = []
    for i in range(rounds):  # traffic keeps coming: a run reads the tail of every partition, the next a backlog
        produce_spread(cfg, good[i * len(good) // rounds:(i + 1) * len(good) // rounds],
                       bad[i * len(bad) // rounds:(i + 1) * len(bad) // rounds])
        tag = uuid.uuid4().hex
        proc = start(cfg, tmp_path, tag, rng.randrange(BATCH // 4, BATCH))
        try:
            drew.append(kill_at_random(proc, rng, cfg.table_store))
            assert not wait_gone(tag), "processes of the killed ingest survive it"
        finally:
            for pid in tagged(tag):
                os.kill(pid, signal.SIGKILL)
        run_ingest(cfg, max_events=rng.randrange(BATCH // 8, BATCH // 2), group_id=f"after-{tag[:8]}")
    runs = 0
    while run_ingest(cfg, max_events=BATCH, group_id=f"drain-{uuid.uuid4().hex[:8]}").consumed:
        runs += 1
        assert runs < 60, "the topic does not drain"

    con = connect(cfg.lake, cfg.table_store)
    rows = con.sql("SELECT tenant, event_id FROM events").fetchall()
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} events landed twice; kills: {drew}"
    assert set(rows) == {(e.tenant, e.event_id) for e in good}
    q = con.sql("SELECT kafka_partition, kafka_offset, raw_value FROM quarantine").fetchall()
    at = {(p, o) for p, o, _ in q}
    assert len(q) == len(at), (f"{len(q)} quarantine rows for {len(at)} bad messages: "
                               f"{len(q) - len(at)} quarantined twice; kills: {drew}")
    assert sorted(r for _, _, r in q) == sorted(bad), "a bad message is missing from the quarantine"
    assert len({p for p, _ in at}) == cfg.kafka.partitions
    if cfg.table_store.local:  # the watermarks of one topic id, never of none ("-")
        for table in (EVENTS, QUARANTINE):
            keys = watermark_keys(Path(cfg.table_store.table_uri(table)))
            assert len({k.rsplit("/", 2)[0] for k in keys}) == 1 and not any("/-/" in k for k in keys), keys
    return drew


@pytest.mark.slow
def test_random_kill_9_of_ingest_leaves_every_bad_message_in_the_quarantine_exactly_once(cfg, tmp_path):
    drew = kill_rounds_then_drain(cfg, tmp_path, seed=int(os.environ.get("TRACERL_KILL_SEED", "5")),
                                  rounds=int(os.environ.get("TRACERL_KILL_ROUNDS", "10")),
                                  n_good_traces=150, n_bad=60)
    print(f"kills: {drew}")
