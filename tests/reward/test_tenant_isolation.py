"""Tenant isolation of the rewards: nothing tenant B can send changes tenant A's rewards.

Ids are chosen by clients (direct Kafka producers choose every id; gateway clients choose the
trace and name turn ids in feedback), so B can reuse A's trace ids, turn ids and event ids.
The reward keys carry the tenant (turn = tenant, trace, turn; event = tenant, event_id), so
A's rewards and corrections, every column, are the same with or without B's events, through
the SQL engine over incremental runs and through the plain-Python reference.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_lake import end, fb, land, now, tool, turn
from pipelines.contract.events import Event
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS
from pipelines.reward import reference
from pipelines.reward.engine import run_rewards
from pipelines.lake.query import register_reward_views
from pipelines.reward.spec import SpecBook

A, B = "acme", "globex"
NOWS = [now(5), now(2 * 3600), now(10 * 3600)]  # one reward run after each batch


def _a(e: Event, i: int) -> Event:
    e.tenant, e.event_id = A, f"ea-{i}"
    return e


A_MAIN = [_a(e, i) for i, e in enumerate([
    turn("a0-0", 0, 0, trace_id="tr-a0"), turn("a0-1", 1, 60, trace_id="tr-a0"),
    fb("a0-0", "thumbs", t=30, value=1, trace_id="tr-a0"), tool("a0-1", "ok", t=61, trace_id="tr-a0"),
    end(120, "completed", success=True, trace_id="tr-a0"),
    turn("a1-0", 0, 10, trace_id="tr-a1"), fb("a1-0", "rating", t=40, value=4, trace_id="tr-a1"),
    fb("a1-0", "regenerate", t=50, trace_id="tr-a1"),
    tool("a1-0", "error", t=15, attempt=2, call_id="c1", trace_id="tr-a1"),
    turn("a2-0", 0, 20, text="", trace_id="tr-a2"), turn("a2-1", 1, 80, trace_id="tr-a2"),
    fb("a2-1", "follow_up", t=90, sentiment="dissatisfied", trace_id="tr-a2"),
    end(200, "abandoned", trace_id="tr-a2"),
    fb("a-ghost", "thumbs", t=100, value=1, trace_id="tr-a0"),           # an orphan of A's own
])]
A_LATE = [_a(e, 100 + i) for i, e in enumerate([                          # after A's turns settled
    fb("a1-0", "thumbs", t=2.5 * 3600, value=-1, trace_id="tr-a1"),
    end(2.6 * 3600, "completed", success=False, trace_id="tr-a1"),
])]
A_BATCHES = [[], A_MAIN, A_LATE]
A_TRACES = sorted({e.trace_id for e in A_MAIN})
A_TURNS = sorted({e.turn_id for e in A_MAIN if hasattr(e, "turn_id")})
A_EVENTS = sorted(e.event_id for e in A_MAIN + A_LATE)


def run_all(root: Path, batches: list[list[Event]]) -> None:
    for batch, at in zip(batches, NOWS):
        if batch:
            land(root, batch)
        run_rewards(root, SpecBook(), now=at)


def tenant_view(root: Path, tenant: str = A) -> tuple[list[dict], list[dict]]:
    """(rewards, corrections) of one tenant, every column but the run's own stamps."""
    con = register_reward_views(duckdb.connect(), root)

    def q(sql: str) -> list[dict]:
        cur = con.execute(sql + " WHERE tenant = ? ORDER BY ALL", [tenant])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]
    return (q("SELECT * EXCLUDE (reward_seq, reward_run, computed_at) FROM rewards"),
            q("SELECT * EXCLUDE (reward_seq) FROM reward_corrections"))


def reference_rows(root: Path, tenant: str = A) -> list[tuple]:
    """The reference, one pass over every file, the tenant's rewards and corrections."""
    _, files = delta.files(root, EVENTS)
    out = reference.compute(reference.read_signals(files), SpecBook(), NOWS[-1])
    rows = [r for r in out.settled + out.provisional + out.corrections if r["tenant"] == tenant]
    return sorted(tuple(sorted((k, repr(v)) for k, v in r.items())) for r in rows)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    root = tmp_path_factory.mktemp("a-only") / "lake"
    run_all(root, A_BATCHES)
    rewards, corrections = tenant_view(root)
    assert len(rewards) == 5 and all(r["settled"] for r in rewards)
    assert {c["reason"] for c in corrections} == {"after_settle", "unknown_turn"}
    return rewards, corrections, reference_rows(root)


# -- what B can send: any event of its own tenant, naming A's ids or its own --------------------

ids = lambda own: st.one_of(st.sampled_from(own), st.text("ab-0123", min_size=1, max_size=6))  # noqa: E731
traces = st.sampled_from(A_TRACES + ["tr-b0", "tr-b1"])
times = st.integers(0, 4 * 3600)
env = dict(tenant=st.just(B), trace_id=traces, event_id=ids(A_EVENTS))
value = st.one_of(st.none(), st.sampled_from([-1, 1, 0]), st.floats(-10, 10, allow_nan=False))
b_feedback = st.builds(
    lambda t, turn_id, kind, **kw: fb(turn_id, kind, t=t, **kw), times, ids(A_TURNS),
    st.sampled_from(["thumbs", "rating", "accept", "edit", "reject", "regenerate", "follow_up", "comment"]),
    value=value, scale_min=st.one_of(st.none(), st.just(1.0)), scale_max=st.one_of(st.none(), st.just(10.0)),
    sentiment=st.one_of(st.none(), st.sampled_from(["satisfied", "neutral", "dissatisfied"])), **env)
b_tool = st.builds(lambda t, turn_id, outcome, **kw: tool(turn_id, outcome, t=t, **kw), times, ids(A_TURNS),
                   st.sampled_from(["ok", "error", "timeout", "invalid_arguments"]),
                   attempt=st.integers(1, 3), call_id=st.sampled_from(["c1", "c2"]), **env)
b_end = st.builds(lambda t, outcome, **kw: end(t, outcome, **kw), times,
                  st.sampled_from(["completed", "abandoned", "escalated", "error"]),
                  success=st.one_of(st.none(), st.booleans()), **env)
b_turn = st.builds(lambda t, turn_id, index, text, **kw: turn(turn_id, index, t, text=text, **kw), times,
                   ids(A_TURNS), st.integers(0, 3), st.sampled_from(["", "Which one?", "Done."]), **env)
b_events = st.lists(st.tuples(st.sampled_from([0, 1, 2]), st.one_of(b_feedback, b_tool, b_end, b_turn)),
                    min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=b_events)
def test_nothing_tenant_b_sends_changes_tenant_a_rewards(baseline, b):
    batches = [list(a) for a in A_BATCHES]
    for k, e in b:                                  # B's events before, among and after A's
        batches[k].append(e)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "lake"
        run_all(root, batches)
        rewards, corrections = tenant_view(root)
        assert (rewards, corrections) == baseline[:2]
        assert reference_rows(root) == baseline[2]


def test_the_same_events_sent_as_tenant_a_do_change_a_rewards(baseline, lake_root):
    """The comparison above can fail: B's kind of events, in A's name, change A's rewards."""
    spoof = [fb("a0-1", "thumbs", t=70, value=-1, trace_id="tr-a0", event_id="x1"),
             end(3 * 3600, "abandoned", trace_id="tr-a2", event_id="x2")]
    for e in spoof:
        e.tenant = A
    run_all(lake_root, [[], A_MAIN + spoof, A_LATE])
    assert tenant_view(lake_root)[0] != baseline[0]
    assert reference_rows(lake_root) != baseline[2]


def test_b_thumbs_on_a_turn_in_a_trace_lands_on_b_as_an_unknown_turn(lake_root):
    land(lake_root, A_MAIN + [fb("a0-1", "thumbs", t=70, value=-1, tenant=B, trace_id="tr-a0", event_id="ea-0")])
    run_rewards(lake_root, SpecBook(), now=NOWS[-1])
    a, _ = tenant_view(lake_root, A)
    b_rewards, b_corrections = tenant_view(lake_root, B)
    assert not b_rewards and [(c["turn_id"], c["reason"]) for c in b_corrections] == [("a0-1", "unknown_turn")]
    assert [r["thumbs"] for r in a if r["turn_id"] == "a0-1"] == [None]   # A's turn kept no thumbs


def test_two_tenants_with_the_same_event_id_in_one_batch_both_count(lake_root):
    both = [turn("t1", tenant=A, event_id="e-turn"), turn("t1", tenant=B, event_id="e-turn"),
            fb("t1", "thumbs", value=1, tenant=A, event_id="e-fb"),
            fb("t1", "thumbs", value=-1, tenant=B, event_id="e-fb")]
    land(lake_root, both)
    r = run_rewards(lake_root, SpecBook(), now=NOWS[-1])
    assert r.settled == 2 and not r.corrections
    con = register_reward_views(duckdb.connect(), lake_root)
    got = con.execute("SELECT tenant, turn_id, thumbs, total FROM rewards ORDER BY tenant").fetchall()
    assert got == [(A, "t1", 1.0, 1.0), (B, "t1", -1.0, -1.0)]


def test_the_learner_reads_a_reward_of_its_own_tenant_for_each_turn(tmp_path):
    """B's settled turn under A's (trace, turn) ids, with the later reward, never feeds A's learner."""
    from pipelines.config import TracerlConfig
    from pipelines.train.run import new_training_turns

    cfg = TracerlConfig(home=tmp_path / "home")
    land(cfg.lake, [turn("t1", tenant=A), fb("t1", "thumbs", value=1, tenant=A)])
    run_rewards(cfg.lake, SpecBook(), now=NOWS[-1])
    land(cfg.lake, [turn("t1", tenant=B), fb("t1", "thumbs", value=-1, tenant=B)])
    run_rewards(cfg.lake, SpecBook(), now=NOWS[-1])
    assert [(t.turn_id, t.reward) for t in new_training_turns(cfg, A, "support", 10)] == [("t1", 1.0)]
    assert [(t.turn_id, t.reward) for t in new_training_turns(cfg, B, "support", 10)] == [("t1", -1.0)]
