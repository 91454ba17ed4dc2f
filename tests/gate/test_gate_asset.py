"""The Dagster side of the gate: `promotion` gates this run's candidates with the real gate
(scripted vLLM backend, real MLflow registry), and its checks decide what reaches `deployment`."""

import dagster as dg

from assets.deploy import deployment
from assets.gate import CANDIDATE_PROMOTED, NO_CONTAMINATION, promotion
from assets.resources import TracerlResource
from tests.gate.gate_fixtures import FakeBackend, candidate, policy_for, question, setup


def test_definitions_load_with_the_gate_asset_and_its_checks():
    from assets.definitions import defs

    repo = defs.get_repository_def()
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("candidate_adapter") in graph.get(dg.AssetKey("promotion")).parent_keys
    assert dg.AssetKey("promotion") in graph.get(dg.AssetKey("deployment")).parent_keys
    specs = {s.name: s for s in promotion.check_specs}
    assert specs[NO_CONTAMINATION].blocking and not specs[CANDIDATE_PROMOTED].blocking
    assert {s.key for s in specs.values()} <= set(graph.asset_check_keys)
    assert repo.has_job("approval_job") and repo.has_sensor_def("approved_challengers")


def _stub(box):
    """Stands in for the learner: registers nothing, reports `box["candidates"]` (None: nothing)."""

    @dg.asset(key="candidate_adapter", output_required=False)
    def stub():
        if box["candidates"] is not None:
            yield dg.MaterializeResult(metadata={"candidates": dg.MetadataValue.json(box["candidates"])})

    return stub


def _run(box, resource, **kw):
    result = dg.materialize([_stub(box), promotion, deployment], resources={"tracerl": resource},
                            raise_on_error=False, **kw)
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    promo = result.asset_materializations_for_node("promotion")
    deployed = result.asset_materializations_for_node("deployment")
    return result, checks, promo[0].metadata if promo else None, deployed[0].metadata if deployed else None


def _gate_one_candidate(tmp_path, mlflow_server, monkeypatch):
    """A registry with one candidate that answers all 3 questions right, and the gate wired to
    the scripted backend: (cfg, tenant, task, registry version, adapter version, backend, resource)."""
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv, av = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av: (3, True)}, tenant, task))
    monkeypatch.setattr("pipelines.gate.run.embedded_backend", lambda cfg, gate: backend)
    monkeypatch.setattr("pipelines.gate.run.gate_config", lambda cfg: gate)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    return cfg, tenant, task, rv, av, backend, TracerlResource(home=str(cfg.home))


def test_a_passing_candidate_deploys_and_a_rejected_one_leaves_the_champion(tmp_path, mlflow_server, monkeypatch):
    cfg, tenant, task, rv_good, av_good, backend, resource = _gate_one_candidate(tmp_path, mlflow_server, monkeypatch)
    route = f"{tenant}/{task}"

    box = {"candidates": [{"tenant": tenant, "task": task, "registry_version": rv_good}]}
    result, checks, promo, deployed = _run(box, resource)
    assert result.success
    assert checks[NO_CONTAMINATION].passed and checks[CANDIDATE_PROMOTED].passed
    assert promo["candidates"].value == 1 and promo["promoted"].value == 1 and promo["rejected"].value == 0
    (decision,) = promo["decisions"].value
    assert decision["outcome"] == "promote" and decision["reasons"]
    deltas = promo["eval_deltas"].value[f"{route} v{rv_good}"]
    assert set(deltas) == {"answers", "style"} and deltas["answers"] > 0.5  # 1/3 right -> all right
    assert promo[f"eval_delta.{route}.answers"].value == deltas["answers"]
    assert promo["champions"].value == {route: {"registry_version": rv_good, "adapter_version": av_good}}
    # the candidate reached deployment: it is what the gateway will serve (none runs here)
    assert deployed["champions"].value == {route: f"v{av_good}"}
    assert deployed["waiting_for_gateway"].value == [f"{route} v{av_good}"] and deployed["swapped"].value == 0

    rv_bad, av_bad = candidate(cfg, tenant, task, parent=av_good)
    backend.policies.update(policy_for({av_bad: (3, False)}, tenant, task))  # guardrail regression
    box["candidates"] = [{"tenant": tenant, "task": task, "registry_version": rv_bad}]
    result, checks, promo, deployed = _run(box, resource)
    assert result.success  # a normal rejection is not a failed run
    assert checks[NO_CONTAMINATION].passed
    warn = checks[CANDIDATE_PROMOTED]
    assert not warn.passed and warn.severity == dg.AssetCheckSeverity.WARN
    assert any("style" in r for r in warn.metadata["reasons"].value[f"{route} v{rv_bad}"])
    assert promo["rejected"].value == 1 and promo["promoted"].value == 0
    assert promo["eval_deltas"].value[f"{route} v{rv_bad}"]["style"] < 0
    assert promo["champions"].value[route]["registry_version"] == rv_good  # unchanged
    assert deployed is not None and deployed["champions"].value == {route: f"v{av_good}"}


def test_contamination_and_gate_errors_block_deployment(tmp_path, mlflow_server, monkeypatch):
    cfg, tenant, task, rv, av, backend, resource = _gate_one_candidate(tmp_path, mlflow_server, monkeypatch)
    monkeypatch.setattr("pipelines.gate.run.trained_prompts",  # the learner trained on an eval item
                        lambda cfg, tenant, task, versions: [[{"role": "user", "content": question(4)}]])

    box = {"candidates": [{"tenant": tenant, "task": task, "registry_version": rv}]}
    result, checks, promo, deployed = _run(box, resource)
    assert not result.success and deployed is None  # blocked
    block = checks[NO_CONTAMINATION]
    assert not block.passed and block.severity == dg.AssetCheckSeverity.ERROR
    assert block.metadata["contaminated"].value == 1 and "contamination" in block.metadata["blocked"].value[0]
    assert promo["decisions"].value[0]["outcome"] == "contaminated" and promo["champions"].value == {
        f"{tenant}/{task}": None}
    assert backend.calls == []  # never evaluated

    box["candidates"] = [{"tenant": tenant, "task": task, "registry_version": "999"}]  # not in the registry
    result, checks, promo, deployed = _run(box, resource)
    assert not result.success and deployed is None
    assert not checks[NO_CONTAMINATION].passed and checks[NO_CONTAMINATION].metadata["gate_errors"].value == 1
    assert promo["decisions"].value[0]["outcome"] == "error"


def test_no_candidate_in_the_run_gates_nothing(tmp_path, mlflow_server, monkeypatch):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    resource = TracerlResource(home=str(cfg.home))
    result, checks, promo, deployed = _run({"candidates": None}, resource)
    assert result.success and promo is None and deployed is None and checks == {}

    # a candidate outside the run's targets is not gated
    rv, _ = candidate(cfg, tenant, task)
    box = {"candidates": [{"tenant": tenant, "task": task, "registry_version": rv}]}
    result, checks, promo, deployed = _run(box, resource, run_config={
        "ops": {"promotion": {"config": {"targets": ["other/task"]}}}})
    assert result.success and promo is None and deployed is None
    assert all(c.passed and c.metadata["candidates"].value == 0 for c in checks.values()) and len(checks) == 2


def test_approval_sensor_and_job_promote_an_approved_challenger(tmp_path, mlflow_server, monkeypatch):
    from assets.review import approval_job, approved_challengers
    from pipelines.gate.run import run_gate
    from pipelines.registry import CHAMPION, adapter_for_alias, model_name
    from pipelines.tracking import client

    cfg, gate, tenant, task = setup(tmp_path, mlflow_server, review=True)
    rv, av = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av: (3, True)}, tenant, task))
    assert run_gate(cfg, tenant, task, rv, backend=backend, gate=gate, training_prompts=[]).decision.outcome == "hold"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    resource = TracerlResource(home=str(cfg.home))
    context = dg.build_sensor_context(resources={"tracerl": resource})
    pending_before = approved_challengers(context)
    assert isinstance(pending_before, dg.SkipReason) or tenant not in pending_before.run_key
    client(cfg).set_model_version_tag(model_name(tenant, task), rv, gate.approval_tag, "true")
    request = approved_challengers(dg.build_sensor_context(resources={"tracerl": resource}))
    assert f"{tenant}.{task}:{rv}" in request.run_key
    assert approval_job.execute_in_process(resources={"tracerl": resource}).success
    assert adapter_for_alias(cfg, tenant, task, CHAMPION) == av
