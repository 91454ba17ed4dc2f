"""The Dagster side: the asset materializes with counts, and each check passes on healthy
traffic and fails on the failure it exists for (drift = reward hacking / broken client)."""

import json
from datetime import datetime, timedelta, timezone

import dagster as dg
import pytest

from assets.ingest import lake_events
from assets.resources import TracerlResource, service_resources
from assets.reward import reward_assets, reward_jobs, reward_schedules, turn_rewards
from reward_lake import fb, land, tool, turn
from pipelines.ingest.sample import generate

START = datetime(2026, 11, 1, tzinfo=timezone.utc)


def materialize(home, now: datetime, expect_success: bool = True):
    result = dg.materialize(
        [turn_rewards], resources=service_resources(TracerlResource(home=str(home))),
        run_config={"ops": {"turn_rewards": {"config": {"now": now.isoformat()}}}}, raise_on_error=False)
    assert result.success == expect_success
    meta = result.asset_materializations_for_node("turn_rewards")[0].metadata
    return meta, {c.check_name: c for c in result.get_asset_check_evaluations()}


def test_definitions_load_with_the_reward_asset_downstream_of_ingest():
    defs = dg.Definitions(assets=[lake_events, *reward_assets], jobs=reward_jobs, schedules=reward_schedules,
                          resources=service_resources(TracerlResource()))
    repo = defs.get_repository_def()
    assert repo.has_schedule_def("rewards_every_5_minutes")
    graph = repo.asset_graph
    assert dg.AssetKey("lake_events") in graph.get(dg.AssetKey("turn_rewards")).parent_keys
    assert {c.name for c in turn_rewards.check_specs} == {"unlabelled_share", "reward_bounds", "component_drift"}
    assert all(c.blocking == (c.name == "reward_bounds") for c in turn_rewards.check_specs)
    assert graph.get(dg.AssetKey("turn_rewards")).freshness_policy is not None


def test_healthy_runs_pass_and_a_broken_client_trips_the_drift_check(tmp_path):
    lake = tmp_path / "lake"
    land(lake, generate(300, seed=1, start=START))
    meta, checks = materialize(tmp_path, START + timedelta(hours=3))
    assert meta["turns_settled"].value > 500 and meta["committed"].value
    assert all(c.passed for c in checks.values()), {k: c.metadata for k, c in checks.items()}
    by_target = meta["mean_reward_by_target"].value  # the mean total reward of this run's settled turns
    labelled = sum(t["labelled_turns"] for t in by_target.values())
    assert labelled == meta["turns_settled"].value - meta["turns_settled_unlabelled"].value > 0
    weighted = sum(t["mean_reward"] * t["labelled_turns"] for t in by_target.values()) / labelled
    assert -1 <= meta["mean_reward"].value <= 1 and abs(meta["mean_reward"].value - weighted) < 1e-5

    land(lake, generate(300, seed=2, start=START + timedelta(hours=4)))   # more of the same: still healthy
    meta, checks = materialize(tmp_path, START + timedelta(hours=8))
    assert checks["component_drift"].passed and checks["component_drift"].metadata["judged"].value >= 3

    # A client update starts reporting every tool call as invalid, while its users vote as they did
    # (a little happier, if anything): `tool` falls and the votes do not follow. The signature of a
    # broken client (or of a policy gaming a signal): ERROR.
    t0 = -2 * 3600  # relative to reward_lake.T0 = START + 12 h
    bad = [e for i in range(300) for e in (
        turn(f"b{i}", 0, t0 + i, trace_id=f"bt-{i}"),
        tool(f"b{i}", "invalid_arguments", t=t0 + i + 1, trace_id=f"bt-{i}"),
        fb(f"b{i}", "thumbs", t=t0 + i + 2, value=1 if i % 5 < 3 else -1, trace_id=f"bt-{i}"))]
    land(lake, bad)
    meta, checks = materialize(tmp_path, START + timedelta(hours=12))
    drift = checks["component_drift"]
    assert not drift.passed and drift.severity == dg.AssetCheckSeverity.ERROR
    components = drift.metadata["components"].value
    assert components["tool"]["level"] == "error" and components["tool"]["drift"] < -0.5
    assert "tool" in drift.metadata["flagged"].value and not drift.metadata["explained"].value
    assert drift.metadata["votes"].value["rows_now"] == 300
    assert "tool -0.77 with votes +0.16 ± 0.17: the votes did not move with it" in drift.metadata["summary"].value
    assert checks["reward_bounds"].passed and checks["unlabelled_share"].passed


def test_unlabelled_share_check_warns_when_feedback_stops(tmp_path):
    land(tmp_path / "lake", [turn(f"u{i}", 0, i, trace_id=f"ut-{i}") for i in range(50)])
    meta, checks = materialize(tmp_path, START + timedelta(days=1))
    c = checks["unlabelled_share"]
    assert not c.passed and c.severity == dg.AssetCheckSeverity.WARN
    assert c.metadata["unlabelled_share"].value == 1.0 and meta["turns_settled_unlabelled"].value == 50
    assert meta["mean_reward"].value is None  # no labelled turn, no mean


def test_bounds_check_fails_on_an_out_of_scale_rating(tmp_path):
    """Written straight into the lake, past ingest validation: the check is the last line."""
    rating = fb("t1", "rating", value=5)
    rating.value = 50
    land(tmp_path / "lake", [turn("t1"), rating])
    _, checks = materialize(tmp_path, START + timedelta(days=1), expect_success=False)  # blocking: the run fails
    c = checks["reward_bounds"]
    assert not c.passed and c.severity == dg.AssetCheckSeverity.ERROR
    assert c.metadata["violations"].value == {"rating": 1, "total": 1}
    assert c.metadata["examples"].value == ["t1"]


@pytest.mark.parametrize("spec_text, expect", [('version = "x9"\n', "x9+"), ("", "builtin-1+")])
def test_spec_path_reaches_the_rows(tmp_path, spec_text, expect):
    path = tmp_path / "rewards.toml"
    path.write_text(spec_text)
    land(tmp_path / "lake", [turn("t1"), fb("t1", "accept")])
    result = dg.materialize([turn_rewards], resources=service_resources(TracerlResource(home=str(tmp_path))),
                            run_config={"ops": {"turn_rewards": {"config": {
                                "spec_path": str(path), "now": (START + timedelta(days=1)).isoformat()}}}})
    versions = result.asset_materializations_for_node("turn_rewards")[0].metadata["spec_versions"].value
    assert len(versions) == 1 and versions[0].startswith(expect), json.dumps(versions)


def test_the_run_shows_how_hindsight_agreed_with_the_votes(tmp_path):
    """A thumbs-down reply followed by a complaint, and one followed by thanks: the metadata says,
    per hindsight kind, on how many voted turns it agreed with the vote."""
    q, a = "How do I reset my router password?", "Hold the reset button for ten seconds."
    events = []
    for trace, nxt, vote in (("c", "That's wrong, the button does nothing.", -1), ("t", "Thanks, that worked!", -1)):
        events += [turn(f"{trace}-1", 0, 0, text=a, user=q, trace_id=trace),
                   turn(f"{trace}-2", 1, 60, user=nxt, trace_id=trace),
                   fb(f"{trace}-1", "thumbs", value=vote, trace_id=trace)]
    land(tmp_path / "lake", events)
    meta, _ = materialize(tmp_path, START + timedelta(days=1))
    agreement = meta["hindsight_vs_votes"].value
    assert agreement["complaint"]["turns"] == 1 and agreement["complaint"]["agree"] == 1
    assert agreement["thanks"]["turns"] == 1 and agreement["thanks"]["agree"] == 0
    assert agreement["reask"]["turns"] == 0 and agreement["reask"]["accuracy"] is None
