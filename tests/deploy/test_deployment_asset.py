"""The deployment asset sits behind the blocking gate and waits for a running gateway."""

import dagster as dg

from assets.definitions import defs
from assets.deploy import deployment
from assets.resources import TracerlResource
from pipelines import registry


def test_deployment_is_downstream_of_the_blocking_gate():
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("candidate_adapter") in graph.get(dg.AssetKey("deployment")).parent_keys
    check = defs.get_repository_def().asset_checks_defs_by_key
    gate = next(c for key, c in check.items() if key.name == "promotion_gate")
    assert gate.check_specs_by_output_name and all(s.blocking for s in gate.check_specs)


def test_champion_waits_for_the_gateway(tmp_path):
    """A real MLflow store (SQLite) with a champion alias, and no gateway running."""
    from pipelines import tracking
    from pipelines.config import TracerlConfig

    cfg = TracerlConfig(home=tmp_path)
    folder = tmp_path / "adapters" / "acme" / "support" / "v1"
    folder.mkdir(parents=True)
    (folder / "READY").touch()
    (folder / "tracerl.json").write_text('{"version": 1, "tenant": "acme", "task": "support"}')
    with tracking.run(cfg, "learner", tags={}, params={}) as run:
        pass
    version = registry.register_candidate(cfg, "acme", "support", run.info.run_id, 1, {})
    registry.set_alias(cfg, "acme", "support", registry.CHAMPION, version)
    result = dg.materialize([deployment], resources={"tracerl": TracerlResource(home=str(tmp_path))})
    meta = result.asset_materializations_for_node("deployment")[0].metadata
    assert meta["swapped"].value == 0
    assert meta["waiting_for_gateway"].value == ["acme/support v1"]
