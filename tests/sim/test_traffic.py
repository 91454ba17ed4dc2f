"""Simulated sessions through the real gateway (tiny model in vLLM): later turns continue the trace,
implicit signals and tool outcomes reach Kafka and the lake like production traffic."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from pipelines.ingest.run import run_ingest
from pipelines.lake.query import connect
from pipelines.reward.engine import run_rewards
from pipelines.sim.families import FollowUp, Tools
from pipelines.sim.traffic import TrafficConfig, simulate
from tests.conftest import make_config
from tests.deploy.conftest import KEYS, boundary  # noqa: F401 - the shared gateway + vLLM fixture


def landed(boundary, tmp_path, app: str, sessions: int):  # noqa: F811
    """Ingest the boundary topic into a lake of our own (own consumer group) until `sessions` ended;
    (its config, a connection)."""
    cfg = make_config(tmp_path, boundary.cfg.kafka.bootstrap_servers)
    cfg.kafka.topic = boundary.cfg.kafka.topic
    deadline = time.monotonic() + 90
    while True:
        run_ingest(cfg)
        con = connect(cfg.lake)
        try:
            n = con.execute("SELECT count(*) FROM session_ends WHERE app = ?", [app]).fetchone()[0]
        except Exception:  # noqa: BLE001 - no events landed yet: the views have nothing to read
            n = 0
        if n >= sessions or time.monotonic() > deadline:
            return cfg, con
        time.sleep(1)


@pytest.mark.slow
def test_sessions_through_the_gateway(boundary, tmp_path):  # noqa: F811
    app = f"sim-{uuid.uuid4().hex[:6]}"
    t = TrafficConfig(task="support", requests=8, users=4, max_tokens=12, turns_per_session=(2, 3),
                      explicit_rate=0.3, app=app, seed=5)
    stats = simulate(boundary.url, KEYS["acme"], t, FollowUp())
    assert stats.failed == 0, stats.errors
    assert stats.requests == 8 and 8 < stats.turns <= 24

    cfg, con = landed(boundary, tmp_path, app, 8)
    turns = con.execute("SELECT trace_id, turn_index FROM turns WHERE app = ? ORDER BY 1, 2", [app]).fetchall()
    assert len(turns) == stats.turns
    by_trace: dict[str, list[int]] = {}
    for trace, idx in turns:
        by_trace.setdefault(trace, []).append(idx)
    assert len(by_trace) == 8 and all(v == list(range(len(v))) for v in by_trace.values())
    ends = dict(con.execute("SELECT trace_id, outcome FROM session_ends WHERE app = ?", [app]).fetchall())
    assert set(ends) == set(by_trace)
    kinds = {k for (k,) in con.execute("SELECT DISTINCT kind FROM feedback WHERE app = ?", [app]).fetchall()}
    assert kinds - {"thumbs"}  # implicit signals went through the gateway too

    run_rewards(cfg.lake, now=datetime.now(timezone.utc) + timedelta(hours=2))  # every session settled
    rows = connect(cfg.lake).execute("""SELECT labelled, total, thumbs, regenerate, follow_up, abandon
                                           FROM rewards WHERE app = ? AND settled""", [app]).fetchall()
    assert len(rows) == stats.turns
    implicit = [r for r in rows if r[2] is None]
    assert implicit and all(r[0] for r in implicit)  # a turn nobody voted on is still labelled by what users did
    negative = [r for r in implicit if any(v is not None and v < 0 for v in r[3:6])]
    assert all(r[1] < 0 for r in negative)  # a regenerate, a complaint or leaving never scores above neutral


@pytest.mark.slow
def test_tool_sessions_report_outcomes(boundary, tmp_path):  # noqa: F811
    app = f"sim-{uuid.uuid4().hex[:6]}"
    t = TrafficConfig(task="support", requests=6, users=3, max_tokens=24, turns_per_session=(1, 1),
                      explicit_rate=0.0, app=app, seed=1)
    fam = Tools()
    stats = simulate(boundary.url, KEYS["acme"], t, fam)
    assert stats.failed == 0, stats.errors
    _, con = landed(boundary, tmp_path, app, 6)
    calls = con.execute("SELECT name, outcome FROM tool_calls WHERE app = ?", [app]).fetchall()
    # the app forces its tool, so every reply is a call (the gateway opened it): each was run and
    # reported, however the tiny model wrote the arguments
    called = con.execute("SELECT count(DISTINCT turn_id) FROM tool_calls WHERE app = ?", [app]).fetchone()[0]
    assert called == 6 and {n for n, _ in calls} <= {"get_weather", "unparsed"}  # unparsed: no JSON to name it
    assert all(o in ("ok", "error", "invalid_arguments") for _, o in calls)
    assert stats.liked <= sum(o == "ok" or o == "error" for _, o in calls)
    assert con.execute("SELECT count(*) FROM turns WHERE app = ?", [app]).fetchone()[0] == 6
