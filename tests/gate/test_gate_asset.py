"""The Dagster side of the gate: `promotion` gates this run's candidate for its target with the real
gate (scripted vLLM backend, real MLflow registry). A rejection is an outcome (metadata and the run's
`tracerl/outcome` tag) and `deployment` still runs; only contamination or a gate error blocks it."""

import dagster as dg

from assets.deploy import deployment
from assets.gate import NO_CONTAMINATION, primary_eval, promotion
from assets.resources import TracerlResource, service_resources
from assets.targets import OUTCOME_TAG, materialize_target, targets
from tests.gate.gate_fixtures import FakeBackend, candidate, policy_for, question, setup


def test_definitions_load_with_the_gate_asset_and_its_checks():
    from assets.definitions import defs

    repo = defs.get_repository_def()
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("candidate_adapter") in graph.get(dg.AssetKey("promotion")).parent_keys
    assert dg.AssetKey("promotion") in graph.get(dg.AssetKey("deployment")).parent_keys
    (spec,) = promotion.check_specs  # a rejection is not a check: only the blocking one
    assert spec.name == NO_CONTAMINATION and spec.blocking and spec.key in set(graph.asset_check_keys)
    assert repo.has_job("approval_job") and repo.has_sensor_def("approved_challengers")


def _stub(box):
    """Stands in for the learner: registers nothing, reports `box["candidate"]` (None: no candidate)."""

    @dg.asset(key="candidate_adapter", partitions_def=targets, output_required=False)
    def stub():
        if box["candidate"] is not None:
            yield dg.MaterializeResult(metadata=box["candidate"])

    return stub


def _run(box, resource, tenant, task):
    with dg.instance_for_test() as instance:
        result = materialize_target([_stub(box), promotion, deployment], tenant, task, instance=instance,
                                    resources=service_resources(resource), raise_on_error=False)
        tags = instance.get_run_by_id(result.run_id).tags
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    promo = result.asset_materializations_for_node("promotion")
    deployed = result.asset_materializations_for_node("deployment")
    return result, checks, promo[0].metadata if promo else None, deployed[0].metadata if deployed else None, tags


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

    box = {"candidate": {"adapter_version": av_good, "registry_version": rv_good}}
    result, checks, promo, deployed, tags = _run(box, resource, tenant, task)
    assert result.success and checks[NO_CONTAMINATION].passed
    assert promo["outcome"].value == "promote" and promo["reasons"].value and tags[OUTCOME_TAG] == "promote"
    assert promo["candidate_adapter_version"].value == av_good and promo["promoted"].value is True
    suites = promo["suites"].value
    assert set(suites) == {"answers", "style"} and suites["answers"]["delta"] > 0.5  # 1/3 right -> all right
    assert promo["eval.answers.delta"].value == suites["answers"]["delta"]  # one number per suite: plotted
    assert promo["eval.answers.delta"].value == 0.6667  # 4 significant digits, not 0.6666666666666667
    # one name per number: the primary suite is named, its scores are its eval.<suite>.* entries
    assert promo["primary_suite"].value == "answers" and not {"eval_candidate", "eval_champion"} & set(promo)
    assert primary_eval({k: v.value for k, v in promo.items()}) == (1.0, 0.3333)
    assert promo["champion_adapter_version"].value == av_good
    assert promo["model_version"].value.endswith(f"/#/models/{tenant}.{task}/versions/{rv_good}")
    # the candidate reached deployment: it is what the gateway will serve (none runs here)
    assert deployed["champions"].value == {route: f"v{av_good}"}
    assert deployed["waiting_for_gateway"].value == [f"{route} v{av_good}"] and deployed["swapped"].value == 0

    rv_bad, av_bad = candidate(cfg, tenant, task, parent=av_good)
    backend.policies.update(policy_for({av_bad: (3, False)}, tenant, task))  # guardrail regression
    box["candidate"] = {"adapter_version": av_bad, "registry_version": rv_bad}
    result, checks, promo, deployed, tags = _run(box, resource, tenant, task)
    assert result.success  # a normal rejection is not a failed run, nor a failed check
    assert checks[NO_CONTAMINATION].passed and set(checks) == {NO_CONTAMINATION}
    assert promo["outcome"].value == "reject" and tags[OUTCOME_TAG] == "reject"
    assert any("style" in r for r in promo["reasons"].value)
    assert promo["eval.style.delta"].value < 0 and promo["promoted"].value is False
    assert promo["champion_adapter_version"].value == av_good  # unchanged
    assert deployed is not None and deployed["champions"].value == {route: f"v{av_good}"}


def test_contamination_and_gate_errors_block_deployment(tmp_path, mlflow_server, monkeypatch):
    cfg, tenant, task, rv, av, backend, resource = _gate_one_candidate(tmp_path, mlflow_server, monkeypatch)
    monkeypatch.setattr("pipelines.gate.run.trained_prompts",  # the learner trained on an eval item
                        lambda cfg, tenant, task, versions: [[{"role": "user", "content": question(4)}]])

    box = {"candidate": {"adapter_version": av, "registry_version": rv}}
    result, checks, promo, deployed, tags = _run(box, resource, tenant, task)
    assert not result.success and deployed is None  # blocked
    block = checks[NO_CONTAMINATION]
    assert not block.passed and block.severity == dg.AssetCheckSeverity.ERROR
    assert block.metadata["outcome"].value == "contaminated" and "contamination" in block.metadata["reasons"].value[0]
    assert promo["outcome"].value == "contaminated" and tags[OUTCOME_TAG] == "contaminated"
    assert backend.calls == []  # never evaluated

    box["candidate"] = {"adapter_version": 999, "registry_version": "999"}  # not in the registry
    result, checks, promo, deployed, tags = _run(box, resource, tenant, task)
    assert not result.success and deployed is None
    assert not checks[NO_CONTAMINATION].passed and promo["outcome"].value == "error"


def test_no_candidate_in_the_run_gates_nothing(tmp_path, mlflow_server, monkeypatch):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    resource = TracerlResource(home=str(cfg.home))
    result, checks, promo, deployed, tags = _run({"candidate": None}, resource, tenant, task)
    assert result.success and promo is None and deployed is None and checks == {}


def test_approval_sensor_and_job_promote_an_approved_challenger(tmp_path, mlflow_server, monkeypatch):
    from assets.review import approval_job, approved_challengers
    from pipelines.gate.run import run_gate
    from pipelines.adapters.registry import CHAMPION, adapter_for_alias, model_name
    from pipelines.tracking import client

    cfg, gate, tenant, task = setup(tmp_path, mlflow_server, review=True)
    rv, av = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av: (3, True)}, tenant, task))
    assert run_gate(cfg, tenant, task, rv, backend=backend, gate=gate, training_prompts=[]).decision.outcome == "hold"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    resource = TracerlResource(home=str(cfg.home))
    with dg.build_sensor_context(resources=service_resources(resource)) as context:
        pending_before = approved_challengers(context)
    assert isinstance(pending_before, dg.SkipReason) or tenant not in pending_before.run_key
    client(cfg).set_model_version_tag(model_name(tenant, task), rv, gate.approval_tag, "true")
    with dg.build_sensor_context(resources=service_resources(resource)) as context:
        request = approved_challengers(context)
    assert f"{tenant}.{task}:{rv}" in request.run_key
    assert approval_job.execute_in_process(resources=service_resources(resource)).success
    assert adapter_for_alias(cfg, tenant, task, CHAMPION) == av
