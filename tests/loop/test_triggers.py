"""What starts the loop: the sensor registers targets as partitions and requests one run per ready
target, saying per target how far the others are; the hourly schedule runs the loop or only
`deployment` per target; neither starts a second run beside one queued or going."""

import uuid

import dagster as dg
import pytest

from assets.definitions import defs
from assets.loop import LOOP_JOB, NEW_TURNS_TAG, closed_loop_hourly, enough_new_turns
from assets.resources import TracerlResource, service_resources
from assets.targets import TARGETS


@pytest.fixture
def two_targets(monkeypatch):
    """acme/support has enough new settled turns, acme/billing does not."""
    counts = {("acme", "support"): 500, ("acme", "billing"): 3}
    monkeypatch.setattr("assets.loop.training_targets", lambda cfg: sorted(counts))
    monkeypatch.setattr("assets.loop.count_new_turns", lambda cfg, tenant, task: counts[(tenant, task)])
    return counts


def _start_run(instance, key, job=LOOP_JOB):
    instance.add_run(dg.DagsterRun(job_name=job, run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED,
                                   tags={"dagster/partition": key}))


def _tick(instance, resource):
    with dg.build_sensor_context(instance=instance, resources=service_resources(resource)) as context:
        return enough_new_turns(context)


def test_sensor_without_settled_turns_requests_nothing(tmp_path):
    resource = TracerlResource(home=str(tmp_path))
    with dg.instance_for_test() as instance:
        out = _tick(instance, resource)
    assert not out.run_requests and not out.dynamic_partitions_requests
    assert "no tenant/task has settled turns" in out.skip_reason.skip_message


def test_sensor_registers_targets_and_requests_the_ready_one(tmp_path, two_targets):
    resource = TracerlResource(home=str(tmp_path))
    need = TracerlResource(home=str(tmp_path)).load().learner.min_new_turns
    with dg.instance_for_test() as instance:
        out = _tick(instance, resource)
        (add,) = out.dynamic_partitions_requests
        assert add.partitions_def_name == TARGETS and sorted(add.partition_keys) == ["acme/billing", "acme/support"]
        (request,) = out.run_requests
        assert request.partition_key == "acme/support" and request.tags[NEW_TURNS_TAG] == f"500/{need}"
        assert out.skip_reason is None
        job = defs.resolve_job_def(LOOP_JOB)
        assert job.partitions_def.name == TARGETS  # the request is one partition of the loop job

        instance.add_dynamic_partitions(TARGETS, add.partition_keys)  # what the daemon does with the request
        _start_run(instance, "acme/support")  # no second loop for a target while one is going
        out = _tick(instance, resource)
        assert not out.run_requests and not out.dynamic_partitions_requests
        why = out.skip_reason.skip_message
        assert f"acme/support: 500/{need} new settled turns, but run" in why and "still going" in why
        assert f"acme/billing: 3/{need} new settled turns" in why  # per target: how far from the threshold



def test_the_threshold_is_each_targets_own(tmp_path, two_targets):
    """[targets."acme/billing".learner] min_new_turns = 2: its 3 new turns are enough for it alone."""
    toml = tmp_path / "tracerl.toml"
    toml.write_text('[targets."acme/billing".learner]\nmin_new_turns = 2\n')
    resource = TracerlResource(config_path=str(toml), home=str(tmp_path))
    with dg.instance_for_test() as instance:
        out = _tick(instance, resource)
    assert {r.partition_key: r.tags[NEW_TURNS_TAG] for r in out.run_requests} == {
        "acme/billing": "3/2", "acme/support": f"500/{resource.load().learner.min_new_turns}"}


def test_hourly_backstop_runs_the_loop_or_only_deployment_per_target(tmp_path, two_targets, monkeypatch):
    resource = TracerlResource(home=str(tmp_path))

    def tick(instance):
        # `with`: the context opens its own instance from the ref; closing it restores Dagster's
        # current-instance state for the tests that run after this one
        with dg.build_schedule_context(instance=instance, resources=service_resources(resource)) as context:
            return closed_loop_hourly(context)

    with dg.instance_for_test() as instance:
        assert isinstance(tick(instance), dg.SkipReason)  # no partition registered yet
        instance.add_dynamic_partitions(TARGETS, ["acme/billing", "acme/support"])
        requests = {r.partition_key: r for r in tick(instance)}
        assert requests["acme/support"].asset_selection is None  # the whole loop
        assert requests["acme/billing"].asset_selection == [dg.AssetKey("deployment")]  # only reconcile

        _start_run(instance, "acme/support")
        assert [r.partition_key for r in tick(instance)] == ["acme/billing"]


def test_the_shipped_instance_queues_one_run_per_target(tmp_path):
    """dagster_home/dagster.yaml: whatever launches through the daemon's queue (sensor, schedule, the
    UI's "Materialize all", a backfill) waits while its target has a run going."""
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parents[2] / "dagster_home" / "dagster.yaml", tmp_path)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        queue = instance.get_concurrency_config().run_queue_config
    assert {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in \
        queue.tag_concurrency_limits
