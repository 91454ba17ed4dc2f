"""The learner's Dagster side: no empty materialization when there is too little new data, and the
run says why (the sensor and the schedule that start the loop: tests/loop/test_triggers.py)."""

import dagster as dg

from assets.resources import TracerlResource, service_resources
from assets.targets import OUTCOME_TAG, REASON_TAG, materialize_target
from assets.train import NO_CANDIDATE, candidate_adapter


def test_asset_skips_cleanly_without_new_turns_and_the_run_says_why(tmp_path):
    resource = TracerlResource(home=str(tmp_path))
    with dg.instance_for_test() as instance:
        result = materialize_target([candidate_adapter], "acme", "support", instance=instance,
                                    resources=service_resources(resource))
        tags = instance.get_run_by_id(result.run_id).tags
    assert result.success
    assert result.asset_materializations_for_node("candidate_adapter") == []
    assert tags[OUTCOME_TAG] == NO_CANDIDATE and "min_new_turns" in tags[REASON_TAG]
