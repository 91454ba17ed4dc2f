"""The lake's Delta tables on an S3-compatible object store (`[tables] uri = "s3://..."`): the same
code as on local disk, by configuration only. No S3 service is reachable here, so the tests start
one from the package registries: moto in server mode, a real HTTP S3 endpoint (it honours the
conditional PUTs delta-rs commits with). Kafka is the session's real broker.

Shown: a kill -9 mid-commit then a rerun is exactly once; two workers on disjoint partitions
append at once; the views, the reward stage and the learner's ledger read and write the tables
there; nothing lands on local disk.
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone

import duckdb
import pytest

from pipelines.config.tables import TablesConfig
from pipelines.faults import EXIT_CODE
from pipelines.ingest.sample import bad_messages, generate
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS, QUARANTINE
from pipelines.lake.ledger import has_ledger, ledger_source, record_ledger
from pipelines.lake.reference import Reference, ReferenceKey, read_reference, record_reference
from pipelines.lake.query import connect
from pipelines.reward.engine import run_rewards
from pipelines.services.process import free_port
from tests.ingest.test_crash import assert_exactly_once, drain, produce, start_ingest, tagged, wait_gone
from tests.ingest.test_workers import two_workers_at_once

BUCKET = "tracerl-lake"
KEY = ReferenceKey("b" * 64, "fp32")


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto server did not start"
                time.sleep(0.1)
        urllib.request.urlopen(urllib.request.Request(f"{url}/{BUCKET}", method="PUT"))  # the bucket
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def s3_cfg(cfg, s3_endpoint, monkeypatch):
    """``cfg`` with its tables under a fresh prefix of the bucket; credentials in the environment,
    as `[tables]` reads them (and the subprocesses inherit)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "tracerl-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "tracerl-test-secret")
    cfg.tables = TablesConfig(uri=f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}", endpoint_url=s3_endpoint, allow_http=True)
    return cfg


def assert_nothing_local(cfg) -> None:
    for dataset in delta.PARTITIONS:  # every table: ingest's, the reward stage's, the learner's
        assert not (cfg.lake / dataset).exists(), f"{dataset} landed on local disk, not in the bucket"


def test_a_kill_mid_commit_on_the_object_store_then_a_rerun_is_exactly_once(s3_cfg, tmp_path):
    cfg = s3_cfg
    good = generate(80, seed=41)
    bad = [raw for _, raw in bad_messages(cfg.ingest.max_event_bytes)]
    produce(cfg, good, bad)
    tag = uuid.uuid4().hex
    proc = start_ingest(cfg, tmp_path, "ingest.after_quarantine", tag)  # quarantine committed, events not
    try:
        proc.wait(timeout=120)
        assert proc.returncode == EXIT_CODE, (tmp_path / "ingest.log").read_text()[-3000:]
        assert not wait_gone(tag)
    finally:
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)
    assert delta.version(cfg.table_store, QUARANTINE) >= 1 and delta.version(cfg.table_store, EVENTS) <= 0
    runs = drain(cfg)
    assert runs[0].landed == len(good) and runs[0].quarantined == 0  # its quarantine is already in
    assert_exactly_once(cfg, good, bad)
    assert_nothing_local(cfg)


def test_two_workers_on_disjoint_partitions_append_to_the_bucket_at_once(s3_cfg, tmp_path):
    two_workers_at_once(s3_cfg, tmp_path)
    assert_nothing_local(s3_cfg)


def test_views_and_rewards_read_the_tables_in_the_bucket(s3_cfg, tmp_path):
    cfg = s3_cfg
    good = generate(40, seed=43)
    produce(cfg, good, [b"not json"])
    drain(cfg)
    local = copy.deepcopy(cfg)  # the same topic landed again by another group, on local disk
    local.tables, local.home, local.kafka.group_id = TablesConfig(), tmp_path / "local", cfg.kafka.group_id + "-local"
    drain(local)
    turns = sum(e.type == "model_turn" for e in good)
    con = connect(cfg.lake, cfg.table_store)
    for view in ("turns", "feedback", "tool_calls", "session_ends"):  # the views read the same either way
        q = f"SELECT * FROM {view} ORDER BY tenant, event_id"
        assert con.execute(q).fetchall() == connect(local.lake).execute(q).fetchall(), view
    assert con.execute("SELECT count(*) FROM turns").fetchone()[0] == turns
    assert con.execute("SELECT typeof(date) FROM events LIMIT 1").fetchone()[0] == "DATE"
    assert con.execute("SELECT count(*) FROM quarantine").fetchone()[0] == 1
    r = run_rewards(cfg.lake, now=datetime.now(timezone.utc) + timedelta(days=7), tables=cfg.table_store)
    assert r.new_files > 0 and r.settled == turns
    again = run_rewards(cfg.lake, now=datetime.now(timezone.utc) + timedelta(days=7), tables=cfg.table_store)
    assert again.new_files == 0  # incremental by the table's version: nothing new read twice
    con = connect(cfg.lake, cfg.table_store)
    assert con.execute("SELECT count(*) FROM rewards WHERE settled").fetchone()[0] == turns
    assert_nothing_local(cfg)


def test_two_learners_ledger_and_reference_rows_land_in_the_bucket_at_once(s3_cfg):
    """Learners of two targets (on different hosts in production) record their steps at one instant:
    the ledger and the reference logprobs they computed."""
    import threading

    cfg = s3_cfg
    assert not has_ledger(cfg.table_store)
    go = threading.Barrier(2)

    def learner(tenant: str) -> None:
        go.wait()
        record_ledger(cfg.table_store, tenant, "support", [f"{tenant}-{i}" for i in range(3)], 1)
        record_reference(cfg.table_store, tenant, "support", KEY, {f"{tenant}-0": Reference("d", [-0.5, -2.0])}, "v1")

    threads = [threading.Thread(target=learner, args=(t,)) for t in ("acme", "globex")]
    [t.start() for t in threads]
    [t.join() for t in threads]
    con = duckdb.connect()
    rows = con.execute(f"SELECT tenant, count(*), min(use) FROM {ledger_source(con, cfg.table_store)} "
                       "GROUP BY tenant ORDER BY tenant").fetchall()
    assert rows == [("acme", 3, 1), ("globex", 3, 1)]
    for tenant in ("acme", "globex"):
        assert read_reference(cfg.table_store, tenant, "support", KEY, [f"{tenant}-0", f"{tenant}-1"]) == \
            {f"{tenant}-0": Reference("d", [-0.5, -2.0])}
    assert_nothing_local(cfg)
