"""The deployment asset sits behind the gate's blocking check and waits for a running gateway."""

from types import SimpleNamespace

import dagster as dg
import pytest

from assets.definitions import defs
from assets.deploy import deployment
from assets.resources import TracerlResource, service_resources
from assets.targets import TARGETS, materialize_target
from pipelines.adapters import registry


def test_deployment_is_downstream_of_the_blocking_gate():
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("promotion") in graph.get(dg.AssetKey("deployment")).parent_keys
    assert graph.get_check_spec(dg.AssetCheckKey(dg.AssetKey("promotion"), "no_contamination")).blocking


def _champion(tmp_path, tenant="acme", task="support", version=1):
    """A real MLflow store (SQLite) with a champion alias on adapter `version`."""
    from pipelines import tracking
    from pipelines.config import TracerlConfig

    cfg = TracerlConfig(home=tmp_path)
    folder = tmp_path / "adapters" / tenant / task / f"v{version}"
    folder.mkdir(parents=True)
    (folder / "READY").touch()
    (folder / "tracerl.json").write_text(f'{{"version": {version}, "tenant": "{tenant}", "task": "{task}"}}')
    with tracking.run(cfg, "learner", tags={}, params={}) as run:
        pass
    rv = registry.register_candidate(cfg, tenant, task, run.info.run_id, version, {})
    registry.set_alias(cfg, tenant, task, registry.CHAMPION, rv)
    return cfg


def test_champion_waits_for_the_gateway(tmp_path):
    _champion(tmp_path)
    resource = TracerlResource(home=str(tmp_path))
    result = materialize_target([deployment], "acme", "support", resources=service_resources(resource))
    meta = result.asset_materializations_for_node("deployment")[0].metadata
    assert meta["swapped"].value == 0
    assert meta["waiting_for_gateway"].value == ["acme/support v1"]
    assert meta["versions_before"].value == meta["versions_after"].value == {"acme/support": "base"}
    assert meta["champions"].value == {"acme/support": "v1"}
    assert meta["gateway"].value == "stopped (start it: tracerl start gateway)"
    assert meta["model_version"].value.endswith("/#/models/acme.support/versions/1")  # the champion, in MLflow

    result = materialize_target([deployment], "acme", "other", resources=service_resources(resource))  # not this route
    meta = result.asset_materializations_for_node("deployment")[0].metadata
    assert meta["waiting_for_gateway"].value == [] and meta["champions"].value == {"acme/other": None}


def test_swap_results_land_in_the_metadata_and_a_failed_swap_fails_the_run(tmp_path, monkeypatch):
    """The gateway is faked at the admin-call boundary: its swap record, and its routes.json flip."""
    from pipelines.deploy.routing import Router
    from pipelines.deploy.service import GatewayError

    _champion(tmp_path, version=2)
    routes = tmp_path / "deploy" / "routes.json"
    Router(routes).flip("acme", "support", 1, str(tmp_path / "adapters/acme/support/v1"))

    def fake_deploy(cfg, tenant, task, version, who):
        Router(routes).flip(tenant, task, version, str(tmp_path / f"adapters/{tenant}/{task}/v{version}"))
        return {"who": who, "action": "deploy", "tenant": tenant, "task": task, "from": "v1",
                "to": f"v{version}", "ok": True, "load_s": 0.5, "drained": True, "drain_s": 1.25, "unloaded": True,
                "requests": 7, "failed_requests": 0}

    gateway = SimpleNamespace(url="http://127.0.0.1:8400", pid=4242)  # its process record
    monkeypatch.setattr("pipelines.deploy.service.read_gateway_state", lambda cfg: gateway)
    monkeypatch.setattr("pipelines.deploy.service.swap", fake_deploy)
    resource = TracerlResource(home=str(tmp_path))
    meta = materialize_target([deployment], "acme", "support", resources=service_resources(resource)
                              ).asset_materializations_for_node("deployment")[0].metadata
    assert meta["swapped"].value == 1 and meta["failed_swaps"].value == 0
    assert meta["versions_before"].value == {"acme/support": "v1"}
    assert meta["versions_after"].value == {"acme/support": "v2"}
    assert meta["swaps"].value[0]["drain_s"] == 1.25 and meta["drain_seconds_max"].value == 1.25
    assert meta["undrained"].value == 0
    assert meta["requests_during_swaps"].value == 7 and meta["failed_requests_during_swaps"].value == 0
    assert meta["gateway"].value == "running on http://127.0.0.1:8400 (pid 4242)"

    Router(routes).flip("acme", "support", 1, str(tmp_path / "adapters/acme/support/v1"), rollback=True)

    def broken(cfg, tenant, task, version, who):
        raise GatewayError("vLLM refused the adapter")

    monkeypatch.setattr("pipelines.deploy.service.swap", broken)
    result = materialize_target([deployment], "acme", "support", resources=service_resources(resource),
                                raise_on_error=False)
    assert not result.success and not result.asset_materializations_for_node("deployment")
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "vLLM refused the adapter" in failure.step_failure_data.error.message
    assert failure.step_failure_data.user_failure_data.metadata["failed_swaps"].value == 1


@pytest.mark.parametrize("bad", ["acme", "acme/", "/support"])
def test_targets_must_name_tenant_and_task(tmp_path, bad):
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(TARGETS, [bad])  # e.g. added by hand in the UI
        result = dg.materialize([deployment], partition_key=bad, instance=instance, raise_on_error=False,
                                resources=service_resources(TracerlResource(home=str(tmp_path))))
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "tenant/task" in failure.step_failure_data.error.to_string()
