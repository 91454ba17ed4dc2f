"""`tracerl lake migrate`: a lake of the layout before Delta (Parquet files committed by manifests,
watermarks in the manifests) moves onto the Delta tables with nothing lost, nothing twice, the
watermarks kept, and the reward runs' place kept; refused until then; safe to run again, even
after a crash halfway."""

from __future__ import annotations

import json
from datetime import date

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipelines.lake import delta
from pipelines.lake.delta import EVENTS, QUARANTINE, REFERENCE, TRAINED_TURNS, LakeLayoutError
from pipelines.lake.ledger import has_ledger, ledger_source
from pipelines.lake.migrate import migrate
from pipelines.lake.query import connect
from pipelines.lake.store import Lake
from pipelines.lake.reference import Reference, ReferenceKey, read_reference
from pipelines.lake.reward_tables import reward_state
from pipelines.lake.tables import (
    CORRECTION_SCHEMA, CORRECTIONS, LEDGER_SCHEMA, OLD_STATE_KEY, PENDING, PROVISIONAL, QUARANTINE_SCHEMA,
    REFERENCE_SCHEMA, REWARD_RUNS, REWARD_SCHEMA, REWARDS,
)
from pipelines.reward.engine import run_rewards
from pipelines.reward.sql import SIGNAL_SCHEMA
from tests.reward.reward_lake import events_table, fb, now, turn

LATE = now(6 * 3600)  # every reward window has passed

TOPIC_ID = "tid-1"


def old_ingest_run(lake: Lake, run: str, events, bad: int, watermarks: dict[str, int]) -> None:
    """One ingest run as the release before Delta committed it: a file per (tenant, date) and one of
    quarantine staged, a manifest with the lake's watermarks after it, published."""
    table = events_table(events, run_id=run)
    with lake.locked():
        txn = lake.begin(run)
        for part in table.select(["tenant", "date"]).group_by(["tenant", "date"]).aggregate([]).to_pylist():
            rows = table.filter((pc.field("tenant") == part["tenant"]) & (pc.field("date") == part["date"]))
            txn.stage(EVENTS, {"tenant": part["tenant"], "date": part["date"]}, rows.drop_columns(["tenant", "date"]))
        if bad:
            q = pa.table({"reason": ["invalid_json"] * bad, "raw_value": [f"{run}-bad-{i}".encode() for i in range(bad)]})
            q = pa.table({f.name: q.column(f.name) if f.name in q.column_names else pa.nulls(bad, f.type)
                          for f in QUARANTINE_SCHEMA}, schema=QUARANTINE_SCHEMA)
            txn.stage(QUARANTINE, {"date": "2026-11-01"}, q)
        m = txn.commit({tp: [0, v] for tp, v in watermarks.items()}, {"landed": len(events)})
        path = lake.log / f"{m.name}.json"
        old = json.loads(path.read_text())
        old.update(watermarks=watermarks, topic_ids={"topic": TOPIC_ID})  # as the old commit wrote them
        path.write_text(json.dumps(old))
        txn.publish()


def old_ledger(lake: Lake, tenant: str, turn_ids: list[str], version: int) -> None:
    """One learner step's ledger rows as the release before Delta committed them (a manifest)."""
    n = len(turn_ids)
    rows = pa.table({"task": ["support"] * n, "turn_id": turn_ids, "adapter_version": [version] * n,
                     "trained_at": [0] * n, "use": [1] * n, "weight": [1.0] * n}, schema=LEDGER_SCHEMA)
    with lake.locked():
        txn = lake.begin(f"learner-{tenant}-v{version}")
        txn.stage(TRAINED_TURNS, {"tenant": tenant}, rows)
        txn.commit({}, {"trained_turns": n})
        txn.publish()


def old_reference(lake: Lake, tenant: str, turn_id: str) -> None:
    rows = pa.table({"task": ["support"], "turn_id": [turn_id], "base_model_hash": ["b" * 64], "precision": ["fp32"],
                     "ids_digest": ["d"], "logprobs": [[-0.5, -1.0]], "computed_at": [0]}, schema=REFERENCE_SCHEMA)
    with lake.locked():
        txn = lake.begin(f"reference-{tenant}")
        txn.stage(REFERENCE, {"tenant": tenant}, rows)
        txn.commit({}, {"reference_logprobs": 1})
        txn.publish()


def references(root) -> dict:
    key = ReferenceKey("b" * 64, "fp32")
    return {t: read_reference(root, t, "support", key, ["t1", "t2"]) for t in ("acme", "globex")}


REFERENCES = {"acme": {"t1": Reference("d", [-0.5, -1.0])}, "globex": {"t2": Reference("d", [-0.5, -1.0])}}


def ledger_rows(root) -> list[tuple]:
    con = duckdb.connect()
    return sorted(con.execute(f"SELECT tenant, turn_id, adapter_version FROM {ledger_source(con, root)}").fetchall())


def _row(schema: pa.Schema, values: dict, drop: tuple = ()) -> pa.Table:
    return pa.table({f.name: pa.array([values[f.name]], f.type) if f.name in values else pa.nulls(1, f.type)
                     for f in schema if f.name not in drop})


def old_reward_run(lake: Lake, read_through: int) -> None:
    """A reward run as the release before Delta committed it: t1 settled, a correction of it, t2 open
    (the provisional snapshot), a signal of an unknown turn pending."""
    day = date(2026, 11, 1)
    with lake.locked():
        txn = lake.begin("old-reward")
        seq, snap, hive = txn.seq, {"snapshot": f"{txn.seq:012d}"}, ("tenant", "date")
        mine = {"reward_seq": seq, "reward_run": "old-reward", "trace_id": "tr-1", "task": "support"}
        txn.stage(REWARDS, {"tenant": "acme", "date": day.isoformat()},
                  _row(REWARD_SCHEMA, {**mine, "turn_id": "t1", "total": 1.0, "settled": True}, hive))
        txn.stage(CORRECTIONS, {"tenant": "acme", "date": day.isoformat()},
                  _row(CORRECTION_SCHEMA, {"event_id": "late", "turn_id": "t1", "reason": "after_settled",
                                           "reward_seq": seq}, hive))
        txn.stage(PROVISIONAL, snap, _row(REWARD_SCHEMA, {**mine, "tenant": "globex", "date": day,
                                                          "turn_id": "t2", "settled": False}))
        txn.stage(PENDING, snap, _row(SIGNAL_SCHEMA, {"event_id": "orphan", "type": "feedback", "tenant": "acme",
                                                      "trace_id": "tr-9", "turn_id": "nope", "kind": "thumbs",
                                                      "value": 1.0, "event_time": now(0), "ingested_at": now(0)}))
        txn.commit({}, {OLD_STATE_KEY: read_through, "reward_settled": 1})
        txn.publish()


def reward_rows(root) -> list[tuple]:
    con = connect(root)
    return sorted(con.sql("SELECT 'r', tenant, turn_id, settled FROM rewards UNION ALL "
                          "SELECT 'c', tenant, event_id, reason = 'after_settled' FROM reward_corrections").fetchall())


MIGRATED_REWARDS = [("c", "acme", "late", True), ("r", "acme", "t1", True), ("r", "globex", "t2", False)]


@pytest.fixture
def old_lake(tmp_path):
    """Two ingest runs (3 turns of 2 tenants, feedback, 3 bad messages), a reward run that read the
    first only, a learner step per tenant on it (the ledger), then a third ingest run."""
    lake = Lake(tmp_path / "lake")
    first = [turn("t1"), turn("t2", tenant="globex"), fb("t1", "thumbs", value=1)]
    old_ingest_run(lake, "r1", first, 2, {"topic:0": 10, "topic:1": 4})
    old_reward_run(lake, 1)
    old_ledger(lake, "acme", ["t1"], 1)
    old_ledger(lake, "globex", ["t2"], 1)
    old_reference(lake, "acme", "t1")
    old_reference(lake, "globex", "t2")
    old_ingest_run(lake, "r3", [turn("t3"), fb("t3", "thumbs", value=-1)], 1, {"topic:0": 15, "topic:1": 4})
    return lake


def ids(root) -> list[tuple]:
    return sorted(connect(root).sql("SELECT tenant, event_id, type FROM events").fetchall())


def test_an_old_lake_is_refused_until_migrated_then_reads_the_same_and_resumes_after_its_watermarks(old_lake):
    root = old_lake.root
    before = sorted((r["tenant"], r["event_id"], r["type"]) for path in (root / EVENTS).rglob("*.parquet")
                    for r in _with_tenant(path))
    with pytest.raises(LakeLayoutError, match="tracerl lake migrate"):
        connect(root)
    with pytest.raises(LakeLayoutError):
        delta.append(root, EVENTS, events_table([turn("t9")]))
    with pytest.raises(RuntimeError, match="tracerl lake migrate"):
        run_rewards(root, now=LATE)
    with pytest.raises(LakeLayoutError, match="trained_turns"):
        has_ledger(root)

    report = migrate(root)
    assert report.files == {QUARANTINE: 2, EVENTS: 3, TRAINED_TURNS: 2, REFERENCE: 2, REWARDS: 1, CORRECTIONS: 1,
                            PROVISIONAL: 1, PENDING: 1} and \
        report.rows == {QUARANTINE: 3, EVENTS: 5, TRAINED_TURNS: 2, REFERENCE: 2, REWARDS: 1, CORRECTIONS: 1,
                        PROVISIONAL: 1, PENDING: 1, REWARD_RUNS: 1}, report
    assert ledger_rows(root) == [("acme", "t1", 1), ("globex", "t2", 1)] and references(root) == REFERENCES
    assert references(root) == REFERENCES
    assert not [p for p in (root / TRAINED_TURNS).rglob("part-0000000000*.parquet")], "an old ledger file left"
    assert ids(root) == before
    assert sorted(connect(root).sql("SELECT raw_value FROM quarantine").fetchall()) == \
        sorted([(b"r1-bad-0",), (b"r1-bad-1",), (b"r3-bad-0",)])
    coords = [("topic", TOPIC_ID, 0), ("topic", TOPIC_ID, 1)]
    assert delta.landed(root, coords) == {coords[0]: 15, coords[1]: 4}  # ingest resumes after them
    assert delta.landed(root, coords, QUARANTINE) == {coords[0]: 15, coords[1]: 4}
    assert not [p for p in (root / EVENTS).rglob("part-0000000000*.parquet")], "an old file left"
    assert reward_rows(root) == MIGRATED_REWARDS
    for dataset in (REWARDS, CORRECTIONS, PROVISIONAL, PENDING):
        assert not [p for p in (root / dataset).rglob("part-0000000000*.parquet")], f"an old {dataset} file left"
    assert not [d for d in root.rglob("*") if d.is_dir() and not any(d.iterdir())], "an empty old folder left"
    # the reward run had read the first ingest run only: it goes on with the third's events
    state = reward_state(root)
    assert (state.events_version, state.run_id) == (1, "old-reward")
    r = run_rewards(root, now=LATE)
    assert r.new_files == 1 and r.seq == state.seq + 1
    turns = connect(root).sql("SELECT turn_id, count(*) FROM rewards WHERE settled GROUP BY ALL").fetchall()
    assert sorted(turns) == [("t1", 1), ("t3", 1)]  # t1 settled before the migration, not again
    pending = connect(root).sql("SELECT event_id, reason FROM reward_corrections").fetchall()
    assert ("orphan", "unknown_turn") in pending  # the old pending signal went on waiting, then expired
    assert migrate(root).line().startswith("nothing to migrate") and ids(root) == before
    assert ledger_rows(root) == [("acme", "t1", 1), ("globex", "t2", 1)]


def test_a_migration_cut_short_anywhere_finishes_when_run_again(old_lake, monkeypatch):
    """Cut after each of its commits in turn (quarantine, events: what the rewards read, the rest,
    the ledger, the references, the four reward datasets, the reward runs): the rerun lands every
    row once."""
    import shutil

    root = old_lake.root
    pristine = root.parent / "pristine"
    shutil.copytree(root, pristine)
    want = ids_after_migration(pristine.parent / "reference", pristine)
    real = delta.append
    for cut in range(1, 11):
        shutil.rmtree(root)
        shutil.copytree(pristine, root)
        calls = []

        def cut_short(*a, **kw):
            calls.append(1)
            if len(calls) == cut + 1:
                raise KeyboardInterrupt("cut")
            return real(*a, **kw)
        monkeypatch.setattr(delta, "append", cut_short)
        with pytest.raises(KeyboardInterrupt):
            migrate(root)
        monkeypatch.setattr(delta, "append", real)
        migrate(root)
        assert ids(root) == want, f"cut after commit {cut}"
        assert len(connect(root).sql("SELECT * FROM quarantine").fetchall()) == 3
        assert ledger_rows(root) == [("acme", "t1", 1), ("globex", "t2", 1)], f"cut after commit {cut}"
        assert references(root) == REFERENCES, f"cut after commit {cut}"
        assert reward_rows(root) == MIGRATED_REWARDS, f"cut after commit {cut}"


def ids_after_migration(scratch, pristine) -> list[tuple]:
    import shutil

    shutil.copytree(pristine, scratch)
    migrate(scratch)
    return ids(scratch)


def _with_tenant(path):
    import pyarrow.parquet as pq

    tenant = next(p.split("=", 1)[1] for p in path.parts if p.startswith("tenant="))
    return [{**r, "tenant": tenant} for r in pq.read_table(path, partitioning=None).select(["event_id", "type"]).to_pylist()]
