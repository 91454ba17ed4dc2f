"""Retention deletes exactly the events older than the period and nothing newer (issue #42, item 3).

One real Delta lake, built once (events landed as ingest stores them, the real reward engine,
reference logprobs, quarantine rows with raw bytes), plus the gateway's journal and spill segments
and gate runs with review tables in the embedded MLflow store. Three tenants: acme keeps 7 days,
globex 3, initech everything (0). Each test works on a copy. Times sit on both sides of each
cutoff, down to the millisecond.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.config import TracerlConfig, load_config
from pipelines.contract.events import Feedback, Message, ModelTurn
from pipelines.ingest import direct
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS, QUARANTINE, REFERENCE
from pipelines.lake.reference import Reference, ReferenceKey, record_reference
from pipelines.lake.tables import CORRECTIONS, PENDING, PROVISIONAL, QUARANTINE_SCHEMA, REWARDS
from pipelines.reward.engine import run_rewards
from pipelines.rights.retention import JOURNAL, REVIEW, SPILL, UNKNOWN, apply_retention, cutoff

UTC = timezone.utc
NOW = datetime(2026, 11, 11, 12, 0, tzinfo=UTC)
PERIODS = {"acme": 7, "globex": 3, "initech": 0}
CUT = {t: cutoff(d, NOW) for t, d in PERIODS.items()}  # acme 2026-11-04, globex 2026-11-08, initech None
SHORTEST = CUT["globex"]  # what names no known tenant follows
MS = timedelta(milliseconds=1)
KEY = ReferenceKey("base", "fp32")


def _toml(home: Path) -> str:
    return (f'home = "{home}"\n' + "".join(f'[targets."{t}".privacy]\nretention_days = {d}\n' for t, d in PERIODS.items()))


def _config(home: Path) -> TracerlConfig:
    home.mkdir(parents=True, exist_ok=True)
    (home.parent / "tracerl.toml").write_text(_toml(home))
    return load_config(str(home.parent / "tracerl.toml"))


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _times(tenant: str) -> list[datetime]:
    """Turn times around the tenant's cutoff (acme's for initech): far, just before, exactly at, after."""
    c = CUT[tenant] or CUT["acme"]
    return [c - timedelta(days=3), c - timedelta(hours=29), c - MS, c, c + MS, c + timedelta(hours=5),
            NOW - timedelta(days=1)]


def _turn(tenant: str, tid: str, t: datetime) -> ModelTurn:
    return ModelTurn(tenant=tenant, app="bot", task="chat", trace_id=f"tr-{tid}", turn_id=tid, turn_index=0,
                     event_time=_iso(t), model="m", output_text=f"reply SECRET-{tid}",
                     input_messages=[Message(role="user", content=f"question SECRET-{tid}")])


def _thumb(tenant: str, tid: str, t: datetime) -> Feedback:
    return Feedback(tenant=tenant, app="bot", task="chat", trace_id=f"tr-{tid}", turn_id=tid, kind="thumbs",
                    value=1, event_time=_iso(t))


def _quarantine_rows() -> list[tuple[str, bytes, datetime]]:
    """(name, raw message, landed at): named tenants on both sides of their cutoffs, and messages
    naming no known tenant on both sides of the shortest period's."""
    out = []
    for tenant in PERIODS:
        c = CUT[tenant] or CUT["acme"]
        for side, landed in (("old", c - MS), ("new", c)):
            out.append((f"q-{tenant}-{side}", json.dumps({"tenant": tenant, "oops": f"SECRET-q-{tenant}-{side}"}).encode(),
                        landed))
    for side, landed in (("old", SHORTEST - MS), ("new", SHORTEST)):
        out.append((f"q-garbage-{side}", f"\xff not json SECRET-q-garbage-{side}".encode("latin-1"), landed))
        out.append((f"q-nobody-{side}", json.dumps({"tenant": "nobody", "x": f"SECRET-q-nobody-{side}"}).encode(),
                    landed))
    return out


def _expired(tenant: str | None, t: datetime) -> bool:
    c = CUT.get(tenant, SHORTEST) if tenant is not None else SHORTEST
    return c is not None and t < c


def _land_quarantine(cfg: TracerlConfig, rows: list[tuple[str, bytes, datetime]]) -> None:
    n = len(rows)
    ms = [int(t.timestamp() * 1000) for _, _, t in rows]
    table = pa.table({"reason": ["not_json"] * n, "error": ["bad"] * n, "raw_value": [r for _, r, _ in rows],
                      "raw_key": [None] * n, "kafka_topic": ["traces"] * n, "kafka_partition": [0] * n,
                      "kafka_offset": list(range(n)), "kafka_timestamp": ms, "quarantined_at": ms,
                      "run_id": ["test"] * n, "date": [t.date().isoformat() for _, _, t in rows]},
                     schema=QUARANTINE_SCHEMA.append(pa.field("date", pa.string())))
    delta.append(cfg.table_store, QUARANTINE, table)


def _segments(cfg: TracerlConfig, turns: dict[str, tuple[str, datetime]]) -> dict[str, bool]:
    """Spill and journal segments of a gateway that is gone (a pid no process has) and of this live
    process; name -> whether retention deletes it."""
    spill = cfg.home / "spill"
    (spill / "journal").mkdir(parents=True)
    dead = _dead_pid()
    old_acme = [tid for tid, (tn, t) in turns.items() if tn == "acme" and t < CUT["acme"]]
    new_acme = [tid for tid, (tn, t) in turns.items() if tn == "acme" and t >= CUT["acme"]]
    old_initech = [tid for tid, (tn, t) in turns.items() if tn == "initech"][:1]

    def line(tid: str) -> str:
        tenant, t = turns[tid]
        return json.dumps(_turn(tenant, tid, t).to_dict())

    files = {
        f"spill-1700000000-{dead}-000000.jsonl": ([line(x) for x in old_acme], True),
        f"spill-1700000000-{dead}-000001.jsonl": ([line(x) for x in old_acme + old_initech], False),  # initech keeps
        f"spill-1700000000-{dead}-000002.jsonl": ([line(x) for x in old_acme + new_acme[:1]], False),
        f"spill-1700000001-{os.getpid()}-000000.jsonl": ([line(x) for x in old_acme], True),   # closed
        f"spill-1700000001-{os.getpid()}-000001.jsonl": ([line(x) for x in old_acme], False),  # being written
        f"journal/journal-1700000000-{dead}-000000.log": ([f"traces\ttid\t0\t{i}\t{line(x)}" for i, x in enumerate(old_acme)],
                                                          True),
        f"journal/journal-1700000000-{dead}-000001.log": (["torn line without tabs"], False),  # no time: its write
    }
    for name, (lines, _) in files.items():
        (spill / name).write_text("".join(ln + "\n" for ln in lines))
    old = SHORTEST.timestamp() - 3600
    (spill / "rejected.jsonl").write_text('{"reason": "x", "event": {"text": "SECRET-rejected"}}\n')
    os.utime(spill / "rejected.jsonl", (old, old))
    (spill / "corrupt.jsonl").write_text('{"text": "recent"}\n')
    return {**{n: gone for n, (_, gone) in files.items()}, "rejected.jsonl": True, "corrupt.jsonl": False}


def _age(lake: Path) -> None:
    """Date every file of the lake two hours back, as a lake landed earlier is: retention expires
    only log entries older than its grace (`LOG_GRACE`, a writer in flight may still need them)."""
    then = time.time() - 2 * 3600
    for path in Path(lake).rglob("*"):
        if path.is_file():
            os.utime(path, (then, then))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _review_runs(cfg: TracerlConfig) -> dict[str, bool]:
    """Gate runs with a side-by-side table, started on both sides of each cutoff; run id -> deleted."""
    import mlflow

    from pipelines import tracking
    from pipelines.gate.side_by_side import ARTIFACT

    out = {}
    for tenant in PERIODS:
        c = CUT[tenant] or CUT["acme"]
        for started in (c - timedelta(seconds=1), c + timedelta(seconds=1)):
            with tracking.run(cfg, f"gate {tenant}", tags={"tenant": tenant, "task": "chat", "tracerl.stage": "gate"},
                              params={}, started=started.timestamp()) as run:
                mlflow.log_table(data={"prompt": [f"SECRET-review-{tenant}"], "candidate": ["a"]}, artifact_file=ARTIFACT)
                mlflow.log_dict({"decision": "promote"}, "gate/decision.json")
                mlflow.log_metric("primary.delta", 0.1)
            out[run.info.run_id] = bool(CUT[tenant]) and started < c
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The pristine state: lake, segments, MLflow store; and what each should lose."""
    root = tmp_path_factory.mktemp("retention")
    cfg = _config(root / "home")
    turns: dict[str, tuple[str, datetime]] = {}
    events = []
    for tenant in PERIODS:
        for i, t in enumerate(_times(tenant)):
            tid = f"{tenant}-{i}"
            turns[tid] = (tenant, t)
            events += [_turn(tenant, tid, t), _thumb(tenant, tid, t + timedelta(seconds=10))]
    direct.land(cfg.lake, events[: len(events) // 2])  # two commits: files of two ingest runs
    direct.land(cfg.lake, events[len(events) // 2:])
    run_rewards(cfg.lake, now=NOW)
    for tenant in PERIODS:
        record_reference(cfg.table_store, tenant, "chat", KEY,
                         {tid: Reference("d", [0.5]) for tid, (tn, _) in turns.items() if tn == tenant}, run="r")
    quarantine = _quarantine_rows()
    _land_quarantine(cfg, quarantine)
    _age(cfg.lake)
    segments = _segments(cfg, turns)
    reviews = _review_runs(cfg)
    return root, turns, quarantine, segments, reviews


@pytest.fixture
def state(built, tmp_path):
    """A copy of the pristine state, its config, and what should go."""
    root, turns, quarantine, segments, reviews = built
    shutil.copytree(root / "home", tmp_path / "home", symlinks=True)
    cfg = _config(tmp_path / "home")
    # the MLflow store names its artifact folder by absolute path: point the copy's runs at the copy
    import sqlite3

    db = sqlite3.connect(cfg.home / "mlflow.db")
    for table, column in (("runs", "artifact_uri"), ("experiments", "artifact_location")):
        db.execute(f"UPDATE {table} SET {column} = replace({column}, ?, ?)", (str(root / "home"), str(cfg.home)))
    db.commit()
    db.close()
    return cfg, turns, quarantine, segments, reviews


def _rows(cfg: TracerlConfig, dataset: str) -> list[dict]:
    table = delta.open_table(cfg.table_store, dataset)
    return [] if table is None else table.to_pyarrow_table().to_pylist()


def _ids(cfg: TracerlConfig, dataset: str, column: str = "turn_id") -> set:
    return {r[column] for r in _rows(cfg, dataset)}


def _parquet_text(cfg: TracerlConfig) -> str:
    """Every value of every Parquet file under the lake (data files and log checkpoints), decompressed,
    and the raw text of every other file (the Delta logs)."""
    out = []
    for path in Path(cfg.lake).rglob("*"):
        if not path.is_file():
            continue
        if path.suffix == ".parquet":
            out.append(json.dumps(pq.read_table(path).to_pylist(), default=lambda v: v.decode("latin-1")
                                  if isinstance(v, bytes) else str(v)))
        else:
            out.append(path.read_bytes().decode("latin-1"))
    return "\n".join(out)


def test_retention_deletes_exactly_what_is_past_each_tenants_period(state):
    cfg, turns, quarantine, segments, reviews = state
    from pipelines import tracking
    from pipelines.gate.side_by_side import ARTIFACT

    gone = {tid for tid, (tenant, t) in turns.items() if CUT[tenant] and t < CUT[tenant]}
    assert gone and gone < set(turns)
    before = {d: _rows(cfg, d) for d in (EVENTS, REWARDS, CORRECTIONS, REFERENCE, QUARANTINE)}
    settled_before = {r["turn_id"] for r in before[REWARDS]}
    assert settled_before == set(turns)  # every turn settled: each has a reward to lose or keep

    report = apply_retention(cfg, now=NOW)

    # events: exactly those before their tenant's cutoff, by event time; nothing newer, nothing of initech
    after = _rows(cfg, EVENTS)
    expected = [e for e in before[EVENTS] if not (CUT[e["tenant"]] and e["event_time"] < CUT[e["tenant"]])]
    assert sorted(e["event_id"] for e in after) == sorted(e["event_id"] for e in expected)
    assert len(after) < len(before[EVENTS])
    for tenant in PERIODS:
        n_before = sum(e["tenant"] == tenant for e in before[EVENTS])
        n_after = sum(e["tenant"] == tenant for e in after)
        assert n_before - n_after == report.deleted.get(EVENTS, {}).get(tenant, 0)
    assert sum(e["tenant"] == "initech" for e in after) == sum(e["tenant"] == "initech" for e in before[EVENTS])
    # the turn 1 ms before the cutoff went, the one at the cutoff stayed; its feedback 10 s later too
    for tenant in ("acme", "globex"):
        c = CUT[tenant]
        times = {e["event_time"] for e in after if e["tenant"] == tenant}
        assert c in times and c - MS not in times and c - MS + timedelta(seconds=10) in times

    # what was derived from the deleted turns went with them
    assert _ids(cfg, REWARDS) == set(turns) - gone
    assert _ids(cfg, REFERENCE) == set(turns) - gone
    assert all(not (CUT[r["tenant"]] and r["event_time"] < CUT[r["tenant"]]) for r in _rows(cfg, CORRECTIONS))
    for dataset, column in ((PROVISIONAL, "turn_time"), (PENDING, "event_time")):
        assert all(not (CUT[r["tenant"]] and r[column] < CUT[r["tenant"]]) for r in _rows(cfg, dataset))
    assert report.deleted[REWARDS] == {t: sum(1 for x in gone if turns[x][0] == t) for t in ("acme", "globex")}

    # quarantine: by landing time; a known tenant's period, else the shortest
    raw_left = {r["raw_value"] for r in _rows(cfg, QUARANTINE)}
    for name, raw, landed in quarantine:
        named = json.loads(raw).get("tenant") if raw.startswith(b"{") else None
        expired = _expired(named if named in PERIODS else None, landed)
        assert (raw not in raw_left) == expired, name
    assert report.deleted[QUARANTINE] == {"acme": 1, "globex": 1, UNKNOWN: 2}

    # the files are gone from storage: no Parquet file (data or checkpoint) nor log entry quotes a deleted turn
    text = _parquet_text(cfg)
    for tid in turns:
        assert (f"SECRET-{tid}" in text) == (tid not in gone), tid
    for name, _, landed in quarantine:
        assert (f"SECRET-{name}" in text) == (name.endswith("new") or name.startswith("q-initech")), name
    assert sum(report.vacuumed.values()) > 0 and report.log_expired[EVENTS] > 0

    # the gateway's segments: whole files whose every record is past its tenant's cutoff; never one being written
    spill = cfg.home / "spill"
    for name, deleted in segments.items():
        assert (not (spill / name).exists()) == deleted, name
    assert report.segment_files == {SPILL: 2, JOURNAL: 1, "logs": 1}

    # review tables: of gate runs started before the cutoff; the runs and their other artifacts stay
    client = tracking.client(cfg)
    for run_id, deleted in reviews.items():
        run = client.get_run(run_id)
        names = {f.path for f in client.list_artifacts(run_id, "gate")}
        assert (ARTIFACT not in names) == deleted and "gate/decision.json" in names
        assert run.data.metrics["primary.delta"] == 0.1
    assert report.deleted[REVIEW] == {"acme": 1, "globex": 1}

    # idempotent: a second run finds nothing, commits nothing
    versions = {d: delta.version(cfg.table_store, d) for d in (EVENTS, REWARDS, REFERENCE, QUARANTINE)}
    again = apply_retention(cfg, now=NOW)
    assert again.total() == 0 and not again.segment_files and sum(again.vacuumed.values()) == 0
    assert sum(again.log_expired.values()) == 0
    assert {d: delta.version(cfg.table_store, d) for d in versions} == versions
    assert sorted(e["event_id"] for e in _rows(cfg, EVENTS)) == sorted(e["event_id"] for e in expected)


def test_a_dry_run_counts_what_a_run_deletes_and_deletes_nothing(state):
    cfg, turns, _, segments, _ = state
    before = {d: delta.version(cfg.table_store, d) for d in (EVENTS, REWARDS, QUARANTINE)}
    dry = apply_retention(cfg, now=NOW, dry_run=True)
    assert {d: delta.version(cfg.table_store, d) for d in before} == before
    assert all((cfg.home / "spill" / n).exists() for n in segments)
    real = apply_retention(cfg, now=NOW)
    assert dry.deleted == real.deleted and dry.segment_files == real.segment_files
    assert dry.cutoffs == real.cutoffs == {"acme": "2026-11-04T00:00:00Z", "globex": "2026-11-08T00:00:00Z",
                                           "initech": None}


def test_the_dagster_job_runs_it_and_shows_the_counts(state):
    from assets.definitions import defs

    cfg, turns, _, _, _ = state
    toml = cfg.home.parent / "tracerl.toml"
    result = defs.resolve_job_def("retention_job").execute_in_process(run_config={
        "resources": {"tracerl": {"config": {"config_path": str(toml)}}},
        "ops": {"apply_retention_periods": {"config": {"now": NOW.isoformat()}}}})
    assert result.success
    report = result.output_for_node("apply_retention_periods")
    (output,) = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = output.event_specific_data.metadata
    gone = sum(1 for tenant, t in turns.values() if CUT[tenant] and t < CUT[tenant])
    assert metadata["deleted.rewards"].value == gone == sum(report["deleted"]["rewards"].values())
    assert metadata["deleted.events"].value == sum(report["deleted"]["events"].values()) > 0
    assert metadata["cutoffs"].value["initech"] is None and metadata["files_vacuumed"].value > 0


def test_the_cli_prints_the_report(state, capsys):
    from tracerl.cli import main

    cfg, _, _, _, _ = state
    toml = str(cfg.home.parent / "tracerl.toml")
    assert main(["--config", toml, "retention", "apply", "--dry-run", "--now", NOW.isoformat()]) == 0
    out = capsys.readouterr().out
    assert "(dry run)" in out and "acme: before 2026-11-04T00:00:00Z" in out and "initech: kept" in out
    assert "events: would delete" in out
    assert main(["--config", toml, "retention", "apply", "--json", "--now", NOW.isoformat()]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["deleted"]["events"]["acme"] > 0 and "initech" not in report["deleted"]["events"]
    assert main(["--config", toml, "retention", "apply", "--now", "2026-11-11T12:00"]) == 1  # no zone


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("retention-property")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(times=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 20 * 24 * 60)), min_size=1,
                      max_size=12),
       periods=st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(0, 12)),
       now_minutes=st.integers(0, 24 * 60 - 1))
def test_any_event_times_and_periods_lose_exactly_the_events_before_the_cutoff(scratch, times, periods, now_minutes):
    home = scratch / uuid.uuid4().hex / "home"
    home.mkdir(parents=True)
    (home.parent / "tracerl.toml").write_text(
        f'home = "{home}"\n' + "".join(f'[targets."{t}".privacy]\nretention_days = {d}\n'
                                      for t, d in zip("abc", periods)))
    cfg = load_config(str(home.parent / "tracerl.toml"))
    start = datetime(2026, 10, 1, tzinfo=UTC)
    now = start + timedelta(days=20, minutes=now_minutes)
    events = [_turn(t, f"{t}-{i}", start + timedelta(minutes=m)) for i, (t, m) in enumerate(times)]
    direct.land(cfg.lake, events)
    _age(cfg.lake)
    report = apply_retention(cfg, now=now)
    cut = {t: cutoff(d, now) for t, d in zip("abc", periods)}
    left = {r["turn_id"] for r in _rows(cfg, EVENTS)}
    expected = {e.turn_id for e in events if not (cut[e.tenant] and datetime.fromisoformat(e.event_time) < cut[e.tenant])}
    assert left == expected
    assert report.total(EVENTS) == len(events) - len(expected)
    for t, c in cut.items():  # kept at least the period, gone within a day after it
        if c is not None:
            assert now - timedelta(days=periods["abc".index(t)] + 1) < c <= now - timedelta(days=periods["abc".index(t)])
    if len(expected) < len(events):
        text = _parquet_text(cfg)
        assert not [e.turn_id for e in events if e.turn_id not in expected and f"SECRET-{e.turn_id}" in text]
    shutil.rmtree(home.parent)


def test_zero_keeps_everything_and_a_negative_period_is_refused(tmp_path):
    from pipelines.config import ConfigError

    cfg = TracerlConfig(home=tmp_path / "home")
    direct.land(cfg.lake, [_turn("acme", "old", datetime(2000, 1, 1, tzinfo=UTC))])
    report = apply_retention(cfg)
    assert report.total() == 0 and report.cutoffs == {"acme": None} and report.default_cutoff is None
    assert _ids(cfg, EVENTS) == {"old"}
    with pytest.raises((ConfigError, ValueError)):
        TracerlConfig(targets={"acme": {"privacy": {"retention_days": -1}}})


def test_a_journal_segment_deleted_under_a_live_gateway_is_forgotten(tmp_path):
    """Retention may delete a closed journal segment a running gateway still tracks: its next sweep
    finds nothing there to re-send and forgets it, instead of failing."""
    from pipelines.deploy.journal import Journal

    journal = Journal(tmp_path / "journal", TracerlConfig(home=tmp_path / "home").table_store, 1 << 20,
                      lambda *a: None)
    journal.append([("traces", "old-id", 0, 5, b'{"event_id": "e"}')])
    assert journal.sweep({"traces": "old-id"}) == []  # closed, waiting for ingest
    (segment,) = journal.closed
    segment.unlink()
    resend = journal.sweep({"traces": "new-id"})  # the broker restarted: it would be re-sent
    assert [(r.events, r.keep) for r in resend] == [([], [])]
    journal.settle(resend[0])
    assert not journal.closed
