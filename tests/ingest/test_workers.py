"""Two ingest workers, each on its own partitions of the topic (`ingest.partitions`), append to the
lake's Delta tables at the same instant: both commits land, from the same table version, and every
valid event is in the lake once, every bad message quarantined once. Then a worker given a
partition the topic lacks is refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from pipelines.config import TracerlConfig
from pipelines.ingest.run import IngestError, run_ingest
from pipelines.ingest.sample import bad_messages, generate
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS
from tests.ingest.test_crash import assert_exactly_once, drain, produce, tables_toml


def start_worker(cfg: TracerlConfig, tmp_path, name: str, partitions: list[int], gate) -> tuple[subprocess.Popen, object]:
    """`tracerl ingest` on `partitions`, holding before its commit until `gate` exists."""
    toml = tmp_path / f"{name}.toml"
    toml.write_text(f"[ingest]\npartitions = {partitions}\nidle_seconds = 1.0\ndecode_workers = 0\n"
                    f"max_event_bytes = {cfg.ingest.max_event_bytes}\n" + tables_toml(cfg))
    env = {**os.environ, "TRACERL_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers, "TRACERL_LAKE": str(cfg.lake),
           "TRACERL_HOME": str(cfg.home), "TRACERL_CONFIG": str(toml),
           "TRACERL_PAUSE": f"ingest.before_commit:{gate}"}
    env.pop("TRACERL_FAILPOINT", None)
    out = open(tmp_path / f"{name}.out", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "tracerl.cli", "ingest", "--topic", cfg.kafka.topic,
                             "--group", cfg.kafka.group_id], env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, out


def test_two_workers_on_disjoint_partitions_commit_at_once_and_every_event_lands_once(cfg, tmp_path):
    two_workers_at_once(cfg, tmp_path)


def two_workers_at_once(cfg, tmp_path) -> None:
    """Two workers on partitions {0, 1} and {2, 3}, held until both wait at their commit."""
    good = generate(100, seed=31)
    bad = [raw for _, raw in bad_messages(cfg.ingest.max_event_bytes)]
    produce(cfg, good, bad)
    before = delta.version(cfg.table_store, EVENTS)
    gate = tmp_path / "go"
    workers = [start_worker(cfg, tmp_path, "a", [0, 1], gate), start_worker(cfg, tmp_path, "b", [2, 3], gate)]
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("go.*"))) < 2:  # both polled their batch and wait at the commit
            assert time.monotonic() < deadline and all(p.poll() is None for p, _ in workers), \
                [o.seek(0) or o.read()[-2000:] for _, o in workers]
            time.sleep(0.05)
        gate.touch()
        for proc, _ in workers:
            assert proc.wait(timeout=120) == 0
    finally:
        for proc, _ in workers:
            if proc.poll() is None:
                proc.kill()
    results = []
    for _, out in workers:
        out.seek(0)
        text = out.read()
        results.append(json.loads(text[text.index("{"):]))
    assert [sorted(r["offsets"]) for r in results] == \
        [[f"{cfg.kafka.topic}:0", f"{cfg.kafka.topic}:1"], [f"{cfg.kafka.topic}:2", f"{cfg.kafka.topic}:3"]]
    assert all(r["landed"] > 0 for r in results)
    commits = sum(len(r["versions"]) for r in results)  # events by both, quarantine by the one that had bad messages
    last = delta.version(cfg.table_store, EVENTS)  # the two commits, one after the other
    assert sorted(r["versions"]["events"] for r in results) == [last - 1, last] and last - 1 > before and commits >= 3
    assert drain(cfg)[0].consumed == 0  # the group's reader finds nothing the workers did not land
    assert_exactly_once(cfg, good, bad)


def test_two_workers_on_the_same_partitions_cannot_both_commit_them(cfg, tmp_path):
    """A worker left running beside its replacement (a zombie) decides from the same snapshot:
    the first commit wins, the second's is refused with nothing of it in the lake; it decides
    again from the lake, finds every offset landed and lands nothing. Every event is there once."""
    good = generate(60, seed=32)
    bad = [raw for _, raw in bad_messages(cfg.ingest.max_event_bytes)]
    produce(cfg, good, bad)
    gate = tmp_path / "go"
    workers = [start_worker(cfg, tmp_path, name, [0, 1, 2, 3], gate) for name in ("a", "b")]
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("go.*"))) < 2:
            assert time.monotonic() < deadline and all(p.poll() is None for p, _ in workers)
            time.sleep(0.05)
        gate.touch()
        codes = sorted(proc.wait(timeout=120) for proc, _ in workers)
    finally:
        for proc, _ in workers:
            if proc.poll() is None:
                proc.kill()
    outs = [o.seek(0) or o.read() for _, o in workers]
    assert codes == [0, 0], outs
    results = sorted((json.loads(o[o.index("{"):]) for o in outs), key=lambda r: r["landed"])
    assert results[0]["landed"] == results[0]["quarantined"] == 0  # the loser: nothing twice
    assert results[0]["already_landed"] == results[0]["consumed"] == results[1]["consumed"] > 0
    assert results[1]["landed"] == len(good)
    assert drain(cfg)[0].consumed == 0
    assert_exactly_once(cfg, good, bad)


def test_a_worker_of_a_partition_the_topic_lacks_is_refused_by_name(cfg):
    cfg.ingest.partitions = [1, 9]
    with pytest.raises(IngestError, match=r"ingest.partitions \[9\] are not partitions"):
        run_ingest(cfg)


def test_writers_that_both_find_no_table_make_one_and_both_land(tmp_path):
    """Two first commits to a fresh table at one instant (two workers' first batch, two learners'
    first step): one creates it, both appends land. delta-rs would retry the losing create as a
    second CREATE TABLE, a metadata change that failed the other's append (29 races in 30 here)."""
    import threading

    import pyarrow as pa

    from pipelines.lake.delta import TRAINED_TURNS

    for trial in range(10):
        root = tmp_path / f"lake{trial}"
        go, errors = threading.Barrier(2), []

        def write(tenant: str) -> None:
            go.wait()
            try:
                delta.append(root, TRAINED_TURNS, pa.table({"turn_id": [f"{tenant}-t"], "tenant": [tenant]}))
            except Exception as err:  # noqa: BLE001 - reported below
                errors.append(repr(err))
        threads = [threading.Thread(target=write, args=(t,)) for t in ("acme", "globex")]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert not errors, (trial, errors)
        table = delta.open_table(root, TRAINED_TURNS)
        assert [h["operation"] for h in table.history()].count("CREATE TABLE") == 1, trial
        assert sorted(table.to_pyarrow_table()["turn_id"].to_pylist()) == ["acme-t", "globex-t"], trial


def test_a_writer_that_decided_on_no_table_conflicts_with_one_that_created_it_meanwhile(tmp_path):
    """Two zombie workers on one partition of a fresh lake both decided that nothing had landed:
    the second commit is checked from the empty version 0, not from the first's commit, and fails."""
    import pyarrow as pa

    coords = {("topic", "tid", 0): 41}
    rows = pa.table({"turn_id": ["a"], "tenant": ["acme"], "date": ["2026-12-01"]})
    delta.append(tmp_path, EVENTS, rows, coords, base=delta.NO_TABLE)
    with pytest.raises(delta.CommitConflict):
        delta.append(tmp_path, EVENTS, rows, coords, base=delta.NO_TABLE)
    assert delta.open_table(tmp_path, EVENTS).to_pyarrow_table().num_rows == 1


def test_vacuum_deletes_the_files_a_killed_writer_left_and_nothing_committed(tmp_path, monkeypatch, capsys):
    """A writer killed after writing its data file and before its commit leaves a file no commit
    names: `tracerl lake vacuum` deletes it once it is older than the limit, keeps a young one (a
    commit in flight), and never touches a committed file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracerl.cli import main

    rows = pa.table({"turn_id": ["a", "b"], "tenant": ["acme", "acme"], "date": ["2026-12-01"] * 2})
    delta.append(tmp_path, EVENTS, rows)
    folder = tmp_path / EVENTS / "tenant=acme" / "date=2026-12-01"
    old, young = folder / "part-00000-orphan-old.parquet", folder / "part-00000-orphan-young.parquet"
    for path in (old, young):
        pq.write_table(rows.select(["turn_id"]), path)
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    committed = set(delta.files(tmp_path, EVENTS)[1])
    os.utime(next(iter(committed)), (time.time() - 3 * 86400,) * 2)  # old, but named by a commit
    monkeypatch.setenv("TRACERL_LAKE", str(tmp_path))
    assert main(["--config", str(tmp_path / "none.toml"), "lake", "vacuum"]) == 0
    assert "events: 1 orphan files deleted" in capsys.readouterr().out
    assert not old.exists() and young.exists() and all(os.path.exists(p) for p in committed)
    assert delta.open_table(tmp_path, EVENTS).to_pyarrow_table().num_rows == 2
