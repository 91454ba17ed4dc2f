"""The learner's Dagster side: no empty runs when there is too little new data."""

import dagster as dg

from assets.resources import TracerlResource
from assets.train import candidate_adapter, enough_new_turns


def test_asset_skips_cleanly_and_sensor_requests_nothing_without_new_turns(tmp_path):
    resource = TracerlResource(home=str(tmp_path))
    result = dg.materialize([candidate_adapter], resources={"tracerl": resource})
    assert result.success
    assert result.asset_materializations_for_node("candidate_adapter") == []
    context = dg.build_sensor_context(resources={"tracerl": resource})
    out = enough_new_turns(context)
    assert isinstance(out, dg.SkipReason) and "new settled turns" in out.skip_message
