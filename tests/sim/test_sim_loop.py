"""One iteration of the in-process loop with sparse, multi-turn users, through real Kafka and the lake."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pipelines.contract.events import Feedback, ModelTurn, ToolCall
from pipelines.models.registry import resolve_base_model
from pipelines.sim.families import FollowUp, Tools
from pipelines.sim.loop import SimTask, iterate, turn_events
from pipelines.sim.policy import HFPolicy, Sample
from pipelines.sim.sessions import Signal, TurnRecord, UserModel
from pipelines.config.train import OptimizerSettings, TrainConfig


@pytest.mark.slow
def test_sparse_sessions_land_and_implicit_only_turns_are_labelled(cfg):
    from pipelines.lake.query import connect

    cfg.train = TrainConfig(base_model="tiny", seed=0, optimizer=OptimizerSettings(steps_per_iteration=1))
    fam = FollowUp()
    t = SimTask.for_family(fam, train_prompts=16, group=4, max_new_tokens=16,
                           users=UserModel(turns_per_session=(1, 3), explicit_rate=0.2))
    base = resolve_base_model("tiny", cfg.home)
    r, _, stats = iterate(cfg, base, HFPolicy(base), fam, t, None, seed=3,
                          now=datetime.now(timezone.utc) + timedelta(hours=2))
    assert stats["landed"] == stats["events"] and stats["sessions"] == 64
    assert stats["turns"] > stats["sessions"]          # some sessions went on past their first turn
    assert 0 < stats["voted"] < stats["turns"] / 2     # ~20% of turns voted

    con = connect(cfg.lake)
    assert con.execute("SELECT count(*) FROM turns WHERE task = 'followup'").fetchone()[0] == stats["turns"]
    assert con.execute("SELECT count(DISTINCT turn_index) FROM turns").fetchone()[0] > 1
    rows = con.execute("""
        SELECT w.labelled, w.total, w.thumbs, w.regenerate, w.follow_up, w.abandon, w.session
        FROM rewards w WHERE w.task = 'followup'""").fetchall()
    assert len(rows) == stats["turns"]
    implicit = [x for x in rows if x[2] is None]
    assert len(implicit) > stats["turns"] / 2
    assert all(x[0] for x in implicit)                 # every turn without thumbs is still labelled
    negative = [x for x in implicit if any(v is not None and v < 0 for v in x[3:6])]
    assert negative and all(x[1] < 0 for x in negative)
    assert r.status in ("trained", "skipped"), r.reason


def test_tool_turns_report_the_real_outcome():
    fam = Tools()
    text = ('<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
            '{"name": "get_weather", "arguments": {"city": "Atlantis"}}, '
            '{"name": "convert_currency", "arguments": {"amount": "ten"}}]</tool_call>')
    s = Sample([1, 2], [3, 4], [-0.1, -0.2], text, "stop")
    env = dict(tenant="acme", app="sim", trace_id="t1", task="tools")
    rec = TurnRecord(0, fam.liked(s), False, [Signal("regenerate")])
    evs = turn_events(env, [{"role": "user", "content": "weather?"}], s, rec, fam, model="tiny",
                      adapter_version=None, max_tokens=16)
    assert isinstance(evs[0], ModelTurn) and not rec.liked
    assert [(e.name, e.outcome) for e in evs if isinstance(e, ToolCall)] == [
        ("get_weather", "ok"), ("get_weather", "error"), ("convert_currency", "invalid_arguments")]
    assert [e.kind for e in evs if isinstance(e, Feedback)] == ["regenerate"]
