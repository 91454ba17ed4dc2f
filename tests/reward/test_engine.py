"""The SQL engine end to end on a real lake: golden signals, credit, settling, late,
duplicate, unknown and contradictory feedback, exactly-once output, incrementality."""

from __future__ import annotations

import duckdb
import pytest

from reward_lake import at, end, fb, land, now, tool, turn
from pipelines.contract.events import Feedback
from pipelines.lake import delta, reward_tables
from pipelines.lake.tables import PENDING, PROVISIONAL, REWARDS
from pipelines.reward import engine
from pipelines.reward.engine import ConcurrentRewardRun, run_rewards
from pipelines.lake.query import register_reward_views
from pipelines.reward.spec import SpecBook

LATE = now(6 * 3600)  # every window has passed


def rows(root) -> dict[str, dict]:
    con = register_reward_views(duckdb.connect(), root)
    return {r["turn_id"]: r for r in con.sql("SELECT * FROM rewards").to_arrow_table().to_pylist()}


def corrections(root) -> list[dict]:
    con = register_reward_views(duckdb.connect(), root)
    return con.sql("SELECT * FROM reward_corrections ORDER BY event_time, turn_id, component") \
              .to_arrow_table().to_pylist()


def one(root, events, book=None, when=LATE) -> dict:
    land(root, events)
    run_rewards(root, book, now=when)
    return rows(root)["t1"]


# -- one golden case per signal (default spec) ---------------------------------------------------
GOLDEN = [
    # (name, extra events for turn t1, expected non-null components, expected total)
    ("no signal", [], {}, None),
    ("thumbs up", [fb("t1", "thumbs", value=1)], {"thumbs": 1.0}, 1.0),
    ("thumbs down", [fb("t1", "thumbs", value=-1)], {"thumbs": -1.0}, -1.0),
    ("rating top", [fb("t1", "rating", value=5)], {"rating": 1.0}, 1.0),
    ("rating middle", [fb("t1", "rating", value=3)], {"rating": 0.0}, 0.0),
    ("rating own scale", [fb("t1", "rating", value=2, scale_min=0, scale_max=10)], {"rating": -0.6}, -0.6),
    ("accept", [fb("t1", "accept")], {"output": 1.0}, 0.75),
    ("edit", [fb("t1", "edit", text="fixed")], {"output": 0.25}, 0.1875),
    ("reject", [fb("t1", "reject")], {"output": -1.0}, -0.75),
    ("accepted then reverted", [fb("t1", "accept", t=10), fb("t1", "reject", t=20)], {"output": -1.0}, -0.75),
    ("regenerate", [fb("t1", "regenerate")], {"regenerate": -1.0}, -0.5),
    ("dissatisfied follow-up", [fb("t1", "follow_up", text="wrong", sentiment="dissatisfied")],
     {"follow_up": -1.0}, -0.5),
    ("satisfied follow-up", [fb("t1", "follow_up", text="thanks", sentiment="satisfied")], {"follow_up": 1.0}, 0.5),
    ("neutral follow-up", [fb("t1", "follow_up", text="and?", sentiment="neutral")], {}, None),
    ("comment", [fb("t1", "comment", text="hm")], {}, None),
    ("abandoned", [end(100, "abandoned")], {"abandon": -1.0}, -0.5),
    ("session success", [end(100, success=True)], {"session": 1.0}, 0.5),
    ("session failure", [end(100, success=False)], {"session": -1.0}, -0.5),
    ("completed, no verdict", [end(100)], {}, None),
    ("tool ok", [tool("t1", "ok")], {"tool": 0.0, "retries": 0.0}, None),
    ("tool timeout", [tool("t1", "timeout")], {"tool": -0.25, "retries": 0.0}, -0.25),
    ("tool error", [tool("t1", "error")], {"tool": -0.5, "retries": 0.0}, -0.5),
    ("tool invalid arguments", [tool("t1", "invalid_arguments")], {"tool": -1.0, "retries": 0.0}, -1.0),
    ("tool error, retried ok", [tool("t1", "error", t=1), tool("t1", "ok", t=2, attempt=2)],
     {"tool": -0.5, "retries": -1 / 3}, -0.5 - 0.25 / 3),
    ("broken call + thumbs up", [tool("t1", "invalid_arguments"), fb("t1", "thumbs", value=1)],
     {"thumbs": 1.0, "tool": -1.0, "retries": 0.0}, 0.0),
]


@pytest.mark.parametrize("name, events, want, total", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_signal(lake_root, name, events, want, total):
    r = one(lake_root, [turn("t1"), *events])
    got = {c: r[c] for c in ("thumbs", "rating", "output", "regenerate", "follow_up", "abandon", "session",
                             "tool", "retries", "latency", "length") if r[c] is not None}
    assert got == pytest.approx(want)
    assert r["labelled"] == (total is not None)
    assert r["total"] == pytest.approx(total) if total is not None else r["total"] is None
    assert r["settled"] and r["spec_version"].startswith("builtin-1+")


@pytest.mark.parametrize("text, events, dodge, total", [
    ("", [], "silent", -0.25),                                         # silence is labelled at the cap
    ("Which order do you mean?", [], "clarify", -0.25),
    ("Which order do you mean?", [fb("t1", "thumbs", value=1)], "clarify", 1.0),   # liked: explicit lifts the cap
    ("Which order do you mean?", [fb("t1", "follow_up", text="ok", sentiment="satisfied"), end(100, success=True)],
     "clarify", -0.25),                                                # implicit credit stays capped
    ("Which order do you mean?", [fb("t1", "thumbs", value=-1)], "clarify", -1.0),
    ("", [tool("t1", "ok")], None, None),                              # acted through a tool: not silent
    ("x" * 400 + "?", [], None, None),                                 # a long answer, not a dodge
])
def test_clarification_and_silence_do_not_dodge(lake_root, text, events, dodge, total):
    r = one(lake_root, [turn("t1", text=text), *events])
    assert r["dodge"] == dodge
    assert r["total"] == pytest.approx(total) if total is not None else r["total"] is None


def test_cost_terms_when_switched_on(lake_root):
    book = SpecBook({"default": {"weights": {"latency": 0.2, "length": 0.1},
                                 "costs": {"latency_budget_ms": 1000, "length_budget_chars": 100}}})
    r = one(lake_root, [turn("t1", text="y" * 50, latency_ms=500), fb("t1", "thumbs", value=1)], book)
    assert r["latency"] == -0.5 and r["length"] == -0.5
    assert r["total"] == pytest.approx(1.0 - 0.1 - 0.05)


# -- credit assignment: every rule, through the engine ---------------------------------------------
@pytest.mark.parametrize("credit, want", [
    ({"rule": "last_turn"}, [None, None, -0.5]),
    ({"rule": "uniform"}, [-0.5, -0.5, -0.5]),
    ({"rule": "discounted", "gamma": 0.5, "min_share": 0.05}, [-0.125, -0.25, -0.5]),
    ({"rule": "discounted", "gamma": 0.5, "min_share": 0.3}, [None, -0.25, -0.5]),
])
def test_session_credit_rules(lake_root, credit, want):
    book = SpecBook({"default": {"credit": credit}})
    land(lake_root, [turn("a", 0, 0), turn("b", 1, 60), turn("c", 2, 120), end(200, "abandoned")])
    run_rewards(lake_root, book, now=LATE)
    got = rows(lake_root)
    assert [got[t]["total"] for t in "abc"] == pytest.approx(want)


# -- settling -----------------------------------------------------------------------------------------
def test_settles_after_the_window_or_after_session_end(lake_root):
    land(lake_root, [turn("t1", 0, 0), fb("t1", "thumbs", t=10, value=1),
                     turn("t2", 0, 0, trace_id="tr-2"), end(100, trace_id="tr-2")])
    run_rewards(lake_root, now=now(999))          # session end + 900 s grace not yet reached
    assert {k: v["settled"] for k, v in rows(lake_root).items()} == {"t1": False, "t2": False}
    run_rewards(lake_root, now=now(1001))
    r = rows(lake_root)
    assert r["t2"]["settled"] and r["t2"]["settle_reason"] == "session_end" and not r["t1"]["settled"]
    assert r["t1"]["total"] == 1.0                # provisional rows show the reward so far
    run_rewards(lake_root, now=now(3600))
    r = rows(lake_root)
    assert r["t1"]["settled"] and r["t1"]["settle_reason"] == "window"


def test_late_feedback_updates_until_settled_then_becomes_a_correction(lake_root):
    land(lake_root, [turn("t1", 0, 0), fb("t1", "thumbs", t=10, value=1)])
    first = run_rewards(lake_root, now=now(300))
    assert first.provisional == 1 and rows(lake_root)["t1"]["total"] == 1.0
    land(lake_root, [fb("t1", "thumbs", t=600, value=-1)])           # late, and contradicts
    second = run_rewards(lake_root, now=now(7200))
    assert second.new_files == 1 and second.settled == 1
    assert rows(lake_root)["t1"]["total"] == -1.0 and rows(lake_root)["t1"]["settled"]
    land(lake_root, [fb("t1", "rating", t=8000, value=5)])           # after settling
    third = run_rewards(lake_root, now=now(9000))
    assert third.settled == 0 and third.corrections == {"after_settle": 1}
    assert rows(lake_root)["t1"]["total"] == -1.0                    # the settled row never changes
    (c,) = corrections(lake_root)
    assert (c["turn_id"], c["reason"], c["component"], c["value"]) == ("t1", "after_settle", "rating", 1.0)


def test_feedback_names_its_turn_in_its_own_trace(lake_root):
    """A turn is (tenant, trace, turn): feedback naming t1 from another trace is not t1's
    (it is recorded as an unknown turn when its window has passed); from t1's own trace it is."""
    land(lake_root, [turn("t1")])
    run_rewards(lake_root, now=LATE)
    land(lake_root, [fb("t1", "reject", t=7 * 3600, trace_id="tr-other")])
    assert run_rewards(lake_root, now=now(8 * 3600)).corrections == {"unknown_turn": 1}
    land(lake_root, [fb("t1", "reject", t=10 * 3600)])
    assert run_rewards(lake_root, now=now(11 * 3600)).corrections == {"after_settle": 1}


def test_late_session_end_is_credited_as_corrections(lake_root):
    land(lake_root, [turn("a", 0, 0), turn("b", 1, 60)])
    run_rewards(lake_root, now=LATE)
    land(lake_root, [end(7 * 3600, "abandoned", success=False)])
    r = run_rewards(lake_root, now=now(8 * 3600))
    assert r.corrections == {"after_settle": 4}
    got = {(c["turn_id"], c["component"]): c["value"] for c in corrections(lake_root)}
    assert got == {("a", "abandon"): -0.5, ("a", "session"): -0.5, ("b", "abandon"): -1.0, ("b", "session"): -1.0}


def test_contradictory_feedback_last_event_time_wins_whatever_the_arrival_order(lake_root):
    land(lake_root, [turn("t1"), fb("t1", "thumbs", t=20, value=-1)])   # the later vote lands first
    run_rewards(lake_root, now=now(60))
    land(lake_root, [fb("t1", "thumbs", t=10, value=1)])
    run_rewards(lake_root, now=LATE)
    assert rows(lake_root)["t1"]["thumbs"] == -1.0


def test_duplicate_feedback_counts_once(lake_root):
    up = fb("t1", "regenerate", t=10)
    land(lake_root, [turn("t1"), up, up, tool("t1", "ok", t=3, attempt=2, call_id="c1")])
    run_rewards(lake_root, now=now(60))
    land(lake_root, [up, tool("t1", "ok", t=3, attempt=2, call_id="c1")])   # re-delivered; a re-sent retry
    land(lake_root, [fb("t1", "regenerate", t=11)])                          # a double click: new id
    run_rewards(lake_root, now=LATE)
    r = rows(lake_root)["t1"]
    assert r["regenerate"] == -1.0 and r["retries"] == pytest.approx(-1 / 3)
    assert r["total"] == pytest.approx(-0.5 - 0.25 / 3)


def test_feedback_for_an_unknown_turn_waits_then_is_recorded(lake_root):
    land(lake_root, [fb("ghost", "thumbs", t=10, value=1), fb("early", "thumbs", t=10, value=-1)])
    r = run_rewards(lake_root, now=now(60))
    assert r.orphans_pending == 2 and r.settled == 0
    land(lake_root, [turn("early", 0, 5)])           # its turn arrives late: the feedback applies
    r = run_rewards(lake_root, now=now(3 * 3600))
    assert rows(lake_root)["early"]["thumbs"] == -1.0
    assert r.corrections == {"unknown_turn": 1}
    (c,) = corrections(lake_root)
    assert (c["turn_id"], c["reason"], c["component"], c["value"]) == ("ghost", "unknown_turn", "thumbs", 1.0)
    assert run_rewards(lake_root, now=now(4 * 3600)).orphans_pending == 0


def test_each_turn_is_written_once_and_runs_read_only_new_files(lake_root):
    land(lake_root, [turn("a", 0, 0), fb("a", "accept"), turn("b", 1, 3000)])
    r1 = run_rewards(lake_root, now=now(3700))
    assert (r1.new_files, r1.settled, r1.provisional) == (1, 1, 1)
    r2 = run_rewards(lake_root, now=now(3700))
    assert not r2.committed and r2.new_files == 0                  # nothing new, nothing written
    land(lake_root, [fb("b", "accept", t=3100)])
    r3 = run_rewards(lake_root, now=LATE)
    assert (r3.new_files, r3.new_signals, r3.settled) == (1, 1, 1)
    con = register_reward_views(duckdb.connect(), lake_root)
    assert con.sql("SELECT count(*), count(DISTINCT turn_id) FROM rewards WHERE settled").fetchall() == [(2, 2)]
    assert con.sql("SELECT count(*) FROM rewards WHERE NOT settled").fetchall() == [(0,)]


def expire_events_log(root) -> None:
    """What Delta does to the events table's log 30 days on (`delta.logRetentionDuration`): at a
    checkpoint it deletes the entries older than that, and versions before the checkpoint are gone."""
    import os
    import time

    table = delta.open_table(root, delta.EVENTS)
    table.create_checkpoint()
    log = os.path.join(delta.store_of(root).table_uri(delta.EVENTS), "_delta_log")
    for name in os.listdir(log):
        os.utime(os.path.join(log, name), (time.time() - 31 * 86400,) * 2)
    table.cleanup_metadata()
    with pytest.raises(Exception, match="No files in log segment"):
        delta.open_table(root, delta.EVENTS, version=table.version() - 1)


def test_a_run_after_the_events_log_expired_reads_what_is_new_once(lake_root):
    """A reward run reads the events files added since the last run. Found by the version read through,
    that needs the version's log, which Delta drops after 30 days: rewards paused that long (the
    learner down for a month while ingest went on) then failed every run, for every tenant. The runs
    record the files they read instead."""
    land(lake_root, [turn("a", 0, 0), fb("a", "accept")])
    first = run_rewards(lake_root, now=now(3700))
    land(lake_root, [turn("b", 1, 3000), fb("b", "accept", t=3100)])
    land(lake_root, [turn("c", 2, 3200)])
    expire_events_log(lake_root)
    r = run_rewards(lake_root, now=LATE)
    assert (first.new_files, r.new_files, r.new_signals, r.settled) == (1, 2, 3, 2)
    assert {t: x["total"] for t, x in rows(lake_root).items()} == {"a": 0.75, "b": 0.75, "c": None}
    assert not run_rewards(lake_root, now=LATE).committed  # and nothing is read twice


def test_the_first_run_after_runs_that_recorded_no_files_reads_by_version_then_records_them_all(lake_root):
    """Runs of the release before `events_files` (and migrated runs) hold only their version."""
    land(lake_root, [turn("a", 0, 0), fb("a", "accept")])
    run_rewards(lake_root, now=now(3700))
    runs = delta.open_table(lake_root, "reward_runs")
    runs.update({"events_files": "NULL"})  # as a run of the release before wrote it
    assert reward_tables.reward_state(lake_root).events_read is None
    land(lake_root, [turn("b", 1, 3000), fb("b", "accept", t=3100)])
    r = run_rewards(lake_root, now=LATE)
    assert (r.new_files, r.settled) == (1, 1)
    assert reward_tables.reward_state(lake_root).events_read == set(
        delta.relative(lake_root, delta.EVENTS, delta.files(lake_root, delta.EVENTS)[1]))
    land(lake_root, [turn("c", 2, 3200)])
    expire_events_log(lake_root)
    assert run_rewards(lake_root, now=LATE).new_files == 1
    assert set(rows(lake_root)) == {"a", "b", "c"}


def test_a_run_killed_before_its_commit_point_leaves_nothing_read_and_the_next_run_redoes_it(lake_root, monkeypatch):
    """Its settled rows, correction and snapshots are in their tables; its row in the run log is not."""
    land(lake_root, [turn("t1"), fb("t1", "accept"), turn("t2", t=100), fb("t2", "thumbs", value=1, t=110),
                     fb("nope", "thumbs", value=1)])
    run_rewards(lake_root, now=now(200))               # both turns open, the orphan pending
    before = (rows(lake_root), corrections(lake_root))
    land(lake_root, [fb("t1", "reject", t=150)])

    def killed(*a, **k):
        raise OSError("killed")
    monkeypatch.setattr(reward_tables, "_commit_point", killed)
    with pytest.raises(OSError):
        run_rewards(lake_root, now=LATE)
    monkeypatch.undo()
    written = {d: delta.version(lake_root, d) for d in (REWARDS, PROVISIONAL, PENDING)}
    assert written[REWARDS] >= 1, "the killed run's settled rows are in the table"
    assert (rows(lake_root), corrections(lake_root)) == before  # and read by no one
    r = run_rewards(lake_root, now=LATE)
    assert r.settled == 2 and rows(lake_root)["t1"]["total"] == -0.75 and rows(lake_root)["t1"]["settled"]
    assert len(rows(lake_root)) == 2 and [c["reason"] for c in corrections(lake_root)] == ["unknown_turn"]


def test_old_open_state_snapshots_are_dropped(lake_root):
    for i in range(4):
        land(lake_root, [turn(f"o{i}", t=i), fb("nope", "thumbs", value=1, t=i)])
        run_rewards(lake_root, now=now(10 + i), keep_snapshots=2)
    runs = reward_tables.reward_state(lake_root).runs.sort_by("seq")["run_id"].to_pylist()
    for dataset in (PROVISIONAL, PENDING):
        left = {p["snapshot"] for p in delta.open_table(lake_root, dataset).partitions()}
        assert left == set(runs[-2:]), dataset
    assert {t for t, r in rows(lake_root).items() if not r["settled"]} == {"o0", "o1", "o2", "o3"}
    removed = delta.vacuum(lake_root, PROVISIONAL, older_than_hours=0)  # the dropped snapshots' files go
    assert removed and not [f for f in removed if any(run in f for run in runs[-2:])]
    assert {t for t, r in rows(lake_root).items() if not r["settled"]} == {"o0", "o1", "o2", "o3"}


def test_concurrent_reward_runs_cannot_both_commit(lake_root, monkeypatch):
    land(lake_root, [turn("t1"), fb("t1", "accept")])
    real = engine.compute

    def racing(*a, **k):
        out = real(*a, **k)
        monkeypatch.setattr(engine, "compute", real)
        run_rewards(lake_root, now=LATE)          # another run commits meanwhile
        return out
    monkeypatch.setattr(engine, "compute", racing)
    with pytest.raises(ConcurrentRewardRun):
        run_rewards(lake_root, now=LATE)
    assert len(rows(lake_root)) == 1


def test_feedback_field_is_last_wins_per_family_not_across_families(lake_root):
    r = one(lake_root, [turn("t1"), fb("t1", "thumbs", t=10, value=1), fb("t1", "reject", t=20),
                        Feedback(tenant="acme", app="bot", task="support", trace_id="tr-1", turn_id="t1",
                                 kind="thumbs", value=1, event_time=at(30))])
    assert (r["thumbs"], r["output"]) == (1.0, -1.0) and r["total"] == pytest.approx(0.25)
