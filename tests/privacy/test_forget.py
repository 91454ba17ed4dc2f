"""`tracerl forget` (pipelines/rights/forget.py): one user's data leaves every store, the adapters
trained on them are marked, and under `retrain` the next candidate's lineage holds none of them.

The served path is replaced by its parts, for time: events land through `pipelines/ingest/direct.py`
`land` (as ingest stores them, the user pseudonymized with the tenant's secret), the gateway's journal
and spill files are written by the real `Journal` and the emitter's line format in a process that
has exited (a closed segment, as after a sweep), the review desk's table is logged with
`mlflow.log_table` to `gate/side_by_side.json` in the real MLflow store of the home. Then the real
reward engine, a real learner iteration on the tiny Llama (ledger, reference logprobs, adapter
store, registry), the real judge and feature caches' SQLite files.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from pipelines.adapters import promote, registry
from pipelines.adapters.store import FORGOTTEN, AdapterStore
from pipelines.config import TracerlConfig
from pipelines.config.train import OptimizerSettings, TrainConfig
from pipelines.contract.events import Feedback, Message, ModelTurn, SessionEnd, ToolCall
from pipelines.durable import file_lock
from pipelines.ingest import direct
from pipelines.models.tiny import make_tiny_llama
from pipelines.privacy import forget_requests as fr
from pipelines.privacy.pseudonym import pseudonym
from pipelines.reward.engine import run_rewards
from pipelines.rights.forget import ForgetError, ForgetRefused, forget
from pipelines.rights.forget_deadline import enforce_deadline
from pipelines.tracking import client
from pipelines.train.run import learner_lock, run_learner
from tests.reward.reward_lake import T0, at

TENANT, TASK = "acme", "support"
CANARY = "zq" + os.urandom(8).hex() + "canary"
USERS = ("alice", "bob", "carol")  # alice is forgotten
REPO = Path(__file__).resolve().parents[2]


def _events(user: str, w: int, canary: str | None = None) -> list:
    """Two traces of two turns each, thumbed one up one down, with a tool call, feedback text and an end."""
    out = []
    for k in range(2):
        trace = f"tr-{user}-{w}-{k}"
        env = dict(tenant=TENANT, app="bot", task=TASK, trace_id=trace)
        for s, thumb in enumerate((1, -1)):
            tid, t = f"{user}-{w}-{k}-{s}", w * 1000 + k * 100 + s * 10
            prompt = f"question {user} {w}.{k}" + (f" my code is {canary}" if canary else "")
            out.append(ModelTurn(**env, user=user, turn_id=tid, turn_index=s, event_time=at(t), model="m",
                                 input_messages=[Message(role="user", content=prompt)],
                                 output_text="Sure, done." if thumb > 0 else "No."))
            out.append(ToolCall(**env, user=user, turn_id=tid, name="lookup", outcome="success", event_time=at(t + 1),
                                arguments={"q": canary or "plain"}))
            # feedback sent without `user`: found through its turn
            out.append(Feedback(**env, turn_id=tid, kind="thumbs", value=thumb, event_time=at(t + 2),
                                text=f"comment {canary or 'fine'}"))
        out.append(SessionEnd(**env, outcome="completed", task_success=True, event_time=at(w * 1000 + k * 100 + 50)))
    return out


def _land(cfg: TracerlConfig, w: int, users=USERS) -> list:
    events = [e for u in users for e in _events(u, w, CANARY if u == "alice" else None)]
    direct.land(cfg.lake, events, home=cfg.home)
    run_rewards(cfg.lake, now=T0 + timedelta(seconds=w * 1000, days=2))
    return events


GATEWAY_FILES = r"""
import json, sys
from pathlib import Path
from pipelines.deploy.journal import Journal
spill, lake, events = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
j = Journal(spill / "journal", lake, 1 << 30, lambda *a: None)
j.append([("tracerl.events", "tid", 0, i, json.dumps(e).encode()) for i, e in enumerate(events)])
(spill / f"spill-0000000001-{__import__('os').getpid()}-000000.jsonl").write_text(
    "".join(json.dumps(e) + "\n" for e in events))
(spill / "rejected.jsonl").write_text("".join(json.dumps({"reason": "test", "event": e}) + "\n" for e in events))
"""


def _gateway_files(cfg: TracerlConfig, events: list) -> None:
    """Journal and spill segments with every event (the gateway's wire form, user as a pseudonym), closed."""
    wire = []
    for e in events:
        d = e.to_dict()
        d["user"] = pseudonym(cfg, d["tenant"], d["user"]) if d.get("user") else None
        wire.append({k: v for k, v in d.items() if v is not None})
    spill = cfg.home / "spill"
    spill.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", GATEWAY_FILES, str(spill), str(cfg.lake), json.dumps(wire)],
                   check=True, cwd=REPO)


def _review_table(cfg: TracerlConfig) -> None:
    import mlflow

    from pipelines import tracking

    prompts = [f"question {u} 0.0" + (f" my code is {CANARY}" if u == "alice" else "") for u in USERS]
    with tracking.run(cfg, f"gate {TENANT}/{TASK}", tags={"tracerl.stage": "gate"}, params={}):
        mlflow.log_table(data={"prompt": prompts, "earlier_messages": [0] * 3,
                               "candidate": [f"reply to {p}" for p in prompts], "champion": ["x"] * 3,
                               "candidate_score": [None] * 3, "champion_score": [None] * 3},
                         artifact_file="gate/side_by_side.json")


def _caches(cfg: TracerlConfig, turns: list[str]) -> None:
    from pipelines.reward.judge import cache_path as judge_cache
    from pipelines.train.feature_cache import FeatureCache, cache_path

    import numpy as np

    fc = FeatureCache(cache_path(cfg))
    fc.put(TENANT, TASK, "base", 1, {t: np.ones(4, dtype=np.float32) for t in turns})
    fc.close()
    path = judge_cache(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE IF NOT EXISTS verdicts (tenant TEXT, turn_id TEXT, rubric TEXT, judge TEXT, "
                "verdict INTEGER, judged_at REAL)")
    with con:
        con.executemany("INSERT INTO verdicts VALUES (?, ?, 'r', 'j', 4, 0)", [(TENANT, t) for t in turns])
    con.close()


def _found(root: Path, needle: str) -> list[str]:
    """Files under ``root`` holding ``needle``: raw bytes, Parquet decompressed, SQLite rows read."""
    import pyarrow.parquet as pq

    hits, raw = [], needle.encode()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if raw in data:
            hits.append(str(path))
        elif data[:4] == b"PAR1":
            if needle in str(pq.read_table(path).to_pylist()):
                hits.append(f"{path} (parquet)")
        elif data[:16] == b"SQLite format 3\x00":
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                if needle in str(con.execute(f'SELECT * FROM "{name}"').fetchall()):
                    hits.append(f"{path} (sqlite {name})")
            con.close()
    return hits


def _per_user(cfg: TracerlConfig) -> dict[str, dict[str, int]]:
    """Rows per user in the events, rewards, ledger and reference tables (by their trace and turn ids)."""
    from pipelines.lake import delta

    tables = {}
    for name in ("events", "rewards", "trained_turns", "reference_logprobs"):
        t = delta.open_table(cfg.table_store, name)
        tables[name] = t.to_pyarrow_table().to_pylist() if t is not None else []
    return {u: {name: sum(1 for r in rows if str(r.get("turn_id") or "").startswith(f"{u}-")
                          or str(r.get("trace_id") or "").startswith(f"tr-{u}-")) for name, rows in tables.items()}
            for u in USERS}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny", seed=0, warmup_steps=0)


def _cfg(home: Path, tiny: Path | None) -> TracerlConfig:
    cfg = TracerlConfig(home=home)
    cfg.gate.suites_dir = str(home.parent / "evals")
    if tiny is not None:
        cfg.train = TrainConfig(base_model=str(tiny), seed=0,
                                optimizer=OptimizerSettings(lr=1e-3, steps_per_iteration=1, micro_batch_size=8))
    cfg.learner.min_new_turns, cfg.learner.max_turns, cfg.learner.replay_turns = 4, 64, 0
    return cfg


def test_forget_removes_the_user_everywhere_and_marks_the_adapters(tmp_path, tiny):
    cfg = _cfg(tmp_path / "home", tiny)
    events = _land(cfg, 0)
    r1 = run_learner(cfg, TENANT, TASK)
    assert r1.status == "trained", r1
    mv1 = registry.version_for_adapter(cfg, TENANT, TASK, r1.adapter_version)
    promote.move_champion(cfg, TENANT, TASK, str(mv1.version), action="promote", who="test", why="test")
    _gateway_files(cfg, events)
    _review_table(cfg)
    _caches(cfg, [e.turn_id for e in events if isinstance(e, ModelTurn)])
    # the canary is in every store before
    before = _found(cfg.home, CANARY)
    for part in ("lake/events", "spill/journal", "spill/spill-", "rejected.jsonl", "side_by_side.json"):
        assert any(part in h for h in before), (part, before)
    counts_before = _per_user(cfg)
    assert counts_before["alice"]["trained_turns"] > 0 and counts_before["bob"]["trained_turns"] > 0

    t = time.monotonic()
    receipt = forget(cfg, TENANT, "alice", "dpo@acme")
    took = time.monotonic() - t
    assert receipt.status == "done" and receipt.actor == "dpo@acme" and receipt.user == pseudonym(cfg, TENANT, "alice")
    assert receipt.counts["lake.events"] == 2 * (2 * 3 + 1)  # 2 traces x (2 turns x 3 events + an end)
    for store in ("lake.rewards", "lake.trained_turns", "judge_verdicts", "reward_model_features",
                  "gateway_journal", "gateway_spill", "mlflow.review_table_rows"):
        assert receipt.counts[store] > 0, (store, receipt.counts)
    assert CANARY not in json.dumps(receipt.to_dict()) and "alice" not in json.dumps(receipt.to_dict())
    # nowhere under the home: lake, caches, journal, spill, MLflow store and artifacts
    assert _found(cfg.home, CANARY) == []
    counts_after = _per_user(cfg)
    assert counts_after["alice"] == {k: 0 for k in counts_after["alice"]}
    for u in ("bob", "carol"):
        assert counts_after[u] == counts_before[u], u
    # the journal and spill keep the others' events
    assert "tr-bob-0-0" in "".join(p.read_text() for p in (cfg.home / "spill").rglob("*.*") if p.is_file())
    # the receipt is recorded
    assert fr.receipts(cfg.home)[-1]["id"] == receipt.id
    # the events files the delete rewrote hold the others' rows the reward stage has read: not new to it
    after = run_rewards(cfg.lake, now=T0 + timedelta(days=3))
    assert after.new_files == 0 and not after.corrections, (after.new_files, after.corrections)

    # (2) the version trained on alice is marked, in the store and the registry, and shown
    store = AdapterStore(cfg.adapter_root)
    v1 = store.get(TENANT, TASK, r1.adapter_version)
    assert receipt.id in v1.meta["marks"][FORGOTTEN]
    mv1 = client(cfg).get_model_version(registry.model_name(TENANT, TASK), mv1.version)
    assert receipt.id in mv1.tags[registry.FORGOTTEN_TAG]
    assert [v["version"] for v in receipt.versions_marked] == [r1.adapter_version]
    assert receipt.deadline is not None  # retrain, and the champion is marked

    # idempotent: again, nothing found, the same marks
    again = forget(cfg, TENANT, "alice", "dpo@acme")
    assert again.repeat and set(again.counts.values()) == {0}
    assert again.versions_marked == receipt.versions_marked

    # retrain: the next candidate trains from the last clean ancestor (here the base model)
    _land(cfg, 1, users=("bob", "carol"))
    r2 = run_learner(cfg, TENANT, TASK)
    assert r2.status == "trained", r2
    lineage = [v.version for v in store.lineage(TENANT, TASK, r2.adapter_version)]
    assert r1.adapter_version not in lineage and lineage == [r2.adapter_version]
    assert r2.reset_reason.startswith("forgotten")

    # the deadline: not yet; past it, the marked champion is replaced (no clean ancestor: the base model)
    from datetime import datetime, timezone

    assert enforce_deadline(cfg, datetime.now(timezone.utc)) == []
    [done] = enforce_deadline(cfg, datetime.now(timezone.utc) + timedelta(days=30))
    assert (done["from"], done["to"]) == (r1.adapter_version, "base")
    assert registry.adapter_for_alias(cfg, TENANT, TASK, registry.CHAMPION) is None
    print(f"forget took {took:.2f} s")


def test_bad_input_leaves_everything(tmp_path):
    cfg = _cfg(tmp_path / "home", None)
    direct.land(cfg.lake, [e for u in ("bob",) for e in _events(u, 0)], home=cfg.home)
    with pytest.raises(ForgetError, match="unknown tenant"):
        forget(cfg, "nobody", "alice")
    with pytest.raises(ForgetError, match="not a tenant id"):
        forget(cfg, "../etc", "alice")
    with pytest.raises(ForgetError, match="empty"):
        forget(cfg, TENANT, " ")
    lake = sorted(p.relative_to(cfg.lake) for p in cfg.lake.rglob("*"))
    r = forget(cfg, TENANT, "nobody-of-ours")
    assert r.status == "no_data" and "no data" in "\n".join(r.lines())
    assert sorted(p.relative_to(cfg.lake) for p in cfg.lake.rglob("*")) == lake
    assert fr.load_request(cfg.home, TENANT, r.user) is None and fr.receipts(cfg.home) == []
    # a learner of the tenant runs: refused, nothing done
    held, release = threading.Event(), threading.Event()

    def learner():
        with file_lock(learner_lock(cfg, TENANT, TASK)):
            held.set()
            release.wait(30)

    th = threading.Thread(target=learner)
    th.start()
    held.wait(10)
    try:
        with pytest.raises(ForgetRefused, match="learner of acme/support"):
            forget(cfg, TENANT, "bob")
    finally:
        release.set()
        th.join()
    assert sorted(p.relative_to(cfg.lake) for p in cfg.lake.rglob("*")) == lake
    assert fr.load_request(cfg.home, TENANT, pseudonym(cfg, TENANT, "bob")) is None


KILLABLE = r"""
import sys
from pipelines.config import TracerlConfig
from pipelines.rights.forget import forget
cfg = TracerlConfig(home=sys.argv[1])
print(forget(cfg, "acme", "alice", "test").status)
"""


def _state(cfg: TracerlConfig) -> dict:
    """What a forget leaves: the lake's rows per table, the gateway files' lines, the review table, the receipts' counts."""
    import pyarrow.parquet as pq  # noqa: F401

    from pipelines.lake import delta

    out = {}
    for name in ("events", "quarantine", "rewards", "reward_corrections", "reward_provisional", "reward_pending"):
        t = delta.open_table(cfg.table_store, name)
        out[name] = None if t is None else sorted(map(str, t.to_pyarrow_table().drop_columns(
            [c for c in ("ingested_at", "computed_at") if c in t.schema().to_arrow().names]).to_pylist()))
    spill = cfg.home / "spill"
    out["gateway"] = {str(p.relative_to(spill)): p.read_text() for p in sorted(spill.rglob("*")) if p.is_file()}
    [table] = list(Path(cfg.artifact_root).rglob("side_by_side.json"))
    out["review"] = json.loads(table.read_text())["data"]
    out["receipt_counts"] = [r["counts"] for r in fr.receipts(cfg.home)]
    return out


def test_kill_9_at_any_point_ends_like_an_uninterrupted_run(tmp_path):
    world = _cfg(tmp_path / "world", None)
    events = _land(world, 0)
    _gateway_files(world, events)
    _review_table(world)
    _caches(world, [e.turn_id for e in events if isinstance(e, ModelTurn)])

    def copy(name: str) -> TracerlConfig:
        home = tmp_path / name
        shutil.copytree(world.home, home)
        cfg = _cfg(home, None)
        # the MLflow artifact folder is found by path: keep the copy's own
        return cfg

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    clean = copy("clean")
    subprocess.run([sys.executable, "-c", KILLABLE, str(clean.home)], check=True, cwd=REPO, env=env)
    want = _state(clean)
    assert _found(clean.home, CANARY) == []
    rng = random.Random(42)
    for seed in range(3):
        cfg = copy(f"killed{seed}")
        for _ in range(2):  # up to two kills, then a run to the end
            p = subprocess.Popen([sys.executable, "-c", KILLABLE, str(cfg.home)], cwd=REPO, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(2.0, 6.0))
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.wait()
        subprocess.run([sys.executable, "-c", KILLABLE, str(cfg.home)], check=True, cwd=REPO, env=env,
                       capture_output=True)
        got = _state(cfg)
        # the first completed run's counts are those of the uninterrupted one; later ones (repeats) 0
        assert got["receipt_counts"][0] == want["receipt_counts"][0], seed
        assert all(set(c.values()) == {0} for c in got["receipt_counts"][1:]), seed
        assert {k: v for k, v in got.items() if k != "receipt_counts"} == \
            {k: v for k, v in want.items() if k != "receipt_counts"}, seed
        assert _found(cfg.home, CANARY) == []
