"""The learner's Dagster side: no empty runs when there is too little new data, and the closed
loop (learner -> promotion -> deployment) requested for just the tenant/tasks that are ready."""

import uuid

import dagster as dg
import pytest

from assets.definitions import defs
from assets.resources import TracerlResource
from assets.train import LOOP_JOB, candidate_adapter, closed_loop_hourly, enough_new_turns


def test_asset_skips_cleanly_and_sensor_requests_nothing_without_new_turns(tmp_path):
    resource = TracerlResource(home=str(tmp_path))
    result = dg.materialize([candidate_adapter], resources={"tracerl": resource})
    assert result.success
    assert result.asset_materializations_for_node("candidate_adapter") == []
    context = dg.build_sensor_context(resources={"tracerl": resource})
    out = enough_new_turns(context)
    assert isinstance(out, dg.SkipReason) and "new settled turns" in out.skip_message


@pytest.fixture
def two_targets(monkeypatch):
    """acme/support has enough new settled turns, acme/billing does not."""
    counts = {("acme", "support"): 500, ("acme", "billing"): 3}
    monkeypatch.setattr("assets.train.training_targets", lambda cfg: sorted(counts))
    monkeypatch.setattr("assets.train.count_new_turns", lambda cfg, tenant, task: counts[(tenant, task)])


def _start_loop_run(instance):
    instance.add_run(dg.DagsterRun(job_name=LOOP_JOB, run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED))


def test_sensor_names_the_ready_targets_for_every_loop_asset(tmp_path, two_targets):
    resource = TracerlResource(home=str(tmp_path))
    with dg.instance_for_test() as instance:
        request = enough_new_turns(dg.build_sensor_context(instance=instance, resources={"tracerl": resource}))
        assert isinstance(request, dg.RunRequest)
        ops = request.run_config["ops"]
        assert {name: ops[name]["config"]["targets"] for name in ops} == {
            "candidate_adapter": ["acme/support"], "promotion": ["acme/support"], "deployment": ["acme/support"]}
        job = defs.resolve_job_def(LOOP_JOB)
        assert dg.validate_run_config(job, request.run_config)  # the request fits the job's config schema

        _start_loop_run(instance)  # no second loop while one is going: the learner has no lock
        out = enough_new_turns(dg.build_sensor_context(instance=instance, resources={"tracerl": resource}))
        assert isinstance(out, dg.SkipReason) and "still going" in out.skip_message


def test_hourly_backstop_runs_the_loop_or_only_resyncs_deployment(tmp_path, two_targets, monkeypatch):
    resource = TracerlResource(home=str(tmp_path))

    def tick(instance):
        # `with`: the context opens its own instance from the ref; closing it restores Dagster's
        # current-instance state for the tests that run after this one
        with dg.build_schedule_context(instance=instance, resources={"tracerl": resource}) as context:
            return closed_loop_hourly(context)

    with dg.instance_for_test() as instance:
        request = tick(instance)
        assert request.run_config["ops"]["promotion"]["config"]["targets"] == ["acme/support"]
        assert request.asset_selection is None  # the whole loop

        monkeypatch.setattr("assets.train.count_new_turns", lambda cfg, tenant, task: 0)
        request = tick(instance)
        assert request.asset_selection == [dg.AssetKey("deployment")] and not request.run_config

        _start_loop_run(instance)
        assert isinstance(tick(instance), dg.SkipReason)
