"""Kill -9 of ingest, of its decode workers, anywhere: every valid event lands exactly once, every
bad message is quarantined exactly once, and nothing the killed process started outlives it.

Each crashed run is a real `tracerl ingest` subprocess on the session's real broker, decoding in
worker processes (`decode_workers=2`, chunks small enough to use them). The reruns drain the topic.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pipelines.faults import EXIT_CODE
from pipelines.ingest.producer import TraceProducer
from pipelines.ingest.run import run_ingest
from pipelines.ingest.sample import bad_messages, generate
from pipelines.lake.query import connect

MARK = "TRACERL_TEST_PROCESS_TAG"  # inherited by every descendant: finds them after reparenting


def tagged(tag: str) -> list[int]:
    """Live processes carrying `tag` in their environment (the killed run's descendants)."""
    found = []
    needle = f"{MARK}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env.split(b"\0") and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def wait_gone(tag: str, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def tables_toml(cfg) -> str:
    """``cfg``'s [tables] section, so a subprocess writes to the same object store (credentials
    from the environment it inherits); "" on the lake folder."""
    t = cfg.tables
    if not t.uri:
        return ""
    return f'[tables]\nuri = "{t.uri}"\nendpoint_url = "{t.endpoint_url}"\nallow_http = {str(t.allow_http).lower()}\n'


def start_ingest(cfg, tmp_path: Path, failpoint: str | None, tag: str) -> subprocess.Popen:
    """`tracerl ingest` with decode workers; output to files (an orphan holding a pipe would hang a reader)."""
    toml = tmp_path / "crash.toml"
    toml.write_text(f'[ingest]\ndecode_workers = 2\ndecode_parallel_from = 20\nidle_seconds = 1.0\n'
                    f'max_event_bytes = {cfg.ingest.max_event_bytes}\n' + tables_toml(cfg))
    env = {**os.environ, "TRACERL_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers, "TRACERL_LAKE": str(cfg.lake),
           "TRACERL_HOME": str(cfg.home), "TRACERL_CONFIG": str(toml), MARK: tag,
           "PYTHONFAULTHANDLER": "1"}  # SIGABRT dumps every thread's stack into the log
    env.pop("TRACERL_FAILPOINT", None)
    if failpoint:
        env["TRACERL_FAILPOINT"] = failpoint
    with open(tmp_path / "ingest.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "tracerl.cli", "ingest", "--topic", cfg.kafka.topic,
                                 "--group", cfg.kafka.group_id], env=env, stdout=log, stderr=subprocess.STDOUT)


def drain(cfg) -> list:
    runs = []
    while (r := run_ingest(cfg)).consumed or not runs:
        runs.append(r)
        assert len(runs) < 10, "the topic does not drain"
    return runs


def assert_exactly_once(cfg, good, bad) -> None:
    con = connect(cfg.lake, cfg.table_store)
    rows = con.sql("SELECT tenant, event_id FROM events").fetchall()
    assert len(rows) == len(set(rows)), "an event landed twice"
    assert set(rows) == {(e.tenant, e.event_id) for e in good}
    raw = [r[0] for r in con.sql("SELECT raw_value FROM quarantine").fetchall()]
    assert sorted(raw) == sorted(bad), "a bad message is missing from the quarantine, or there twice"
    for view in ("turns", "feedback", "tool_calls", "session_ends"):
        con.sql(f"SELECT count(*) FROM {view}").fetchall()  # every view reads what landed


def produce(cfg, good, bad) -> None:
    """The good events with the bad messages spread among them."""
    step = len(good) // len(bad)
    with TraceProducer(cfg) as p:
        for i, e in enumerate(good):
            p.send(e)
            if i % step == 0 and i // step < len(bad):
                p.send_raw(b"k", bad[i // step])


CASES = [("ingest.before_commit", 0), ("ingest.after_quarantine", 0), ("ingest.after_commit", 0),
         (None, 1), (None, 2), (None, 3)]


@pytest.mark.parametrize("failpoint,seed", CASES, ids=[p or f"random-time-{s}" for p, s in CASES])
def test_kill_9_anywhere_then_rerun_is_exactly_once_without_orphans(cfg, tmp_path, failpoint, seed):
    rng = random.Random(seed)
    good = generate(60 + rng.randrange(60), seed=100 + seed)  # ~250-500 events over 4 partitions
    bad = [raw for _, raw in bad_messages(cfg.ingest.max_event_bytes)]
    produce(cfg, good, bad)
    tag = uuid.uuid4().hex
    proc = start_ingest(cfg, tmp_path, failpoint, tag)
    try:
        if failpoint:
            proc.wait(timeout=120)
            assert proc.returncode == EXIT_CODE, (tmp_path / "ingest.log").read_text()[-3000:]
        else:  # a wall-clock kill: while the interpreter loads, the group joins, chunks decode or land
            time.sleep(rng.uniform(0.5, 4.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        left = wait_gone(tag)
        assert not left, f"processes of the killed ingest survive it: {left}"
    finally:
        for pid in tagged(tag):  # leave no orphan to the rest of the suite, whatever failed
            os.kill(pid, signal.SIGKILL)
    runs = drain(cfg)
    assert_exactly_once(cfg, good, bad)
    print(f"{failpoint or 'kill -9 at random time'} (rc {proc.returncode}): reruns "
          f"{[(r.consumed, r.landed, r.quarantined, r.duplicates, r.already_landed) for r in runs]}")


def test_a_decode_worker_killed_mid_batch_loses_nothing(cfg, tmp_path):
    """The OOM killer takes a decode worker: its chunks (and those a broken pool refuses) are decoded
    inline instead; the run ends by itself and all of the batch lands, once. In a subprocess, so a
    run that hangs fails this test instead of hanging the suite."""
    good = generate(150, seed=7)
    bad = [raw for _, raw in bad_messages(cfg.ingest.max_event_bytes)]
    produce(cfg, good, bad)
    tag = uuid.uuid4().hex
    proc = start_ingest(cfg, tmp_path, None, tag)
    killed = None
    try:
        deadline = time.monotonic() + 60
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            if found := workers(tag):
                killed = found[0]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.02)
        assert killed is not None, "no decode worker was started"
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=30)
            pytest.fail("ingest hung after one of its decode workers was killed; its threads:\n"
                        + (tmp_path / "ingest.log").read_text()[-4000:])
        assert proc.returncode == 0, (tmp_path / "ingest.log").read_text()[-3000:]
        assert not wait_gone(tag)
    finally:
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)
    drain(cfg)
    assert_exactly_once(cfg, good, bad)


def workers(tag: str) -> list[int]:
    """The decode workers (not the resource tracker) among the processes carrying `tag`."""
    out = []
    for pid in tagged(tag):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            continue
    return out
