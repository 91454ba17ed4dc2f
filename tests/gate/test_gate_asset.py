"""The Dagster side: a blocking check on candidate_adapter that gates the run's candidates."""

import dagster as dg

from assets.gate import promotion_gate
from assets.resources import TracerlResource
from tests.gate.gate_fixtures import FakeBackend, candidate, policy_for, setup


def test_definitions_load_with_the_gate_check():
    from assets.definitions import defs
    from assets.gate import gate_checks, gate_jobs, gate_sensors

    repo = defs.get_repository_def()
    if not any(promotion_gate.check_key in c.check_keys for c in repo.asset_checks_defs_by_key.values()):
        # not wired into assets/definitions.py yet: check it resolves beside everything else
        repo = dg.Definitions.merge(defs, dg.Definitions(asset_checks=gate_checks, jobs=gate_jobs, sensors=gate_sensors)).get_repository_def()
    assert promotion_gate.check_key in repo.asset_checks_defs_by_key
    assert repo.has_job("approval_job") and repo.has_sensor_def("approved_challengers")


def test_blocking_check_passes_a_good_candidate_and_fails_a_bad_one(tmp_path, mlflow_server, monkeypatch):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv_good, av_good = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av_good: (3, True)}, tenant, task))
    monkeypatch.setattr("pipelines.gate.run.embedded_backend", lambda cfg, gate: backend)
    monkeypatch.setattr("pipelines.gate.run.gate_config", lambda cfg: gate)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    box = {"candidates": []}

    @dg.asset(key="candidate_adapter")
    def stub():
        return dg.MaterializeResult(metadata={"candidates": dg.MetadataValue.json(box["candidates"])})

    @dg.asset(deps=["candidate_adapter"])
    def deployment():
        return 1

    resource = TracerlResource(home=str(cfg.home))
    box["candidates"] = [{"tenant": tenant, "task": task, "registry_version": rv_good}]
    result = dg.materialize([stub, deployment, promotion_gate], resources={"tracerl": resource},
                            raise_on_error=False)
    evals = result.get_asset_check_evaluations()
    assert [e.passed for e in evals] == [True] and evals[0].metadata["promoted"].value == 1
    assert result.asset_materializations_for_node("deployment")

    rv_bad, av_bad = candidate(cfg, tenant, task, parent=av_good)
    backend.policies.update(policy_for({av_bad: (3, False)}, tenant, task))  # guardrail regression
    box["candidates"] = [{"tenant": tenant, "task": task, "registry_version": rv_bad}]
    result = dg.materialize([stub, deployment, promotion_gate], resources={"tracerl": resource},
                            raise_on_error=False)
    evals = result.get_asset_check_evaluations()
    assert [e.passed for e in evals] == [False] and evals[0].metadata["rejected"].value == 1
    assert not result.asset_materializations_for_node("deployment")  # blocked


def test_approval_sensor_and_job_promote_an_approved_challenger(tmp_path, mlflow_server, monkeypatch):
    from assets.gate import approval_job, approved_challengers
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
