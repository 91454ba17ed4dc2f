"""The canary demo's machinery on the tiny model (`tracerl demo --canary`, assets/canary_demo.py).

Real everything: the session's Kafka, vLLM (CPU, LoRA), the gateway, simulated users, MLflow, a
Dagster instance in a temp DAGSTER_HOME. A candidate (v2, a random LoRA on the tiny base) is
canaried against the bootstrap champion by the operator, then the demo's bad candidate (v2
applied backwards) is gated offline and canaried. Each canary round is simulated sessions through
the split, then `ingest_job`, `reward_job` and `canary_job` in process; probe users send requests
during every step. What the tiny model's users prefer is noise, so which way a canary goes is not
asserted here (bench and the SmolLM2 demo measure that); that each decision is carried out in the
registry and the gateway, with zero failed requests, is.
"""

from __future__ import annotations

import json

import dagster as dg
import pytest

from tests.e2e.conftest import demo_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory, broker):
    """The stack on the tiny model serving the bootstrap champion v1, and v2 published and registered."""
    from assets.canary_demo import CanaryDemoConfig
    from assets.resources import TracerlResource
    from pipelines import stack
    from pipelines.adapters import registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.config import load_config
    from pipelines.loop.bootstrap import ensure_serving
    from pipelines.loop.demo import LoopConfig
    from pipelines.models.registry import base_model_hash, resolve_base_model
    from pipelines.services.kafka import ensure_topic
    from pipelines.sim.traffic import TrafficConfig
    from tests.deploy.test_vllm import make_adapter

    tmp = tmp_path_factory.mktemp("canary-demo")
    with demo_env(tmp, broker.bootstrap, "canary-demo") as toml:
        lc = LoopConfig(traffic=TrafficConfig(requests=24, users=6, max_tokens=8), preference_max_tokens=6,
                        swap_probe_users=2)
        dc = CanaryDemoConfig(min_sessions=5, t_opt=40, max_rounds=3)
        resource = TracerlResource(config_path=str(toml), targets_json=json.dumps(
            {"acme/concise": dc.target_entry()}))
        cfg = load_config(toml)
        ensure_topic(cfg)
        try:
            for name in stack.SERVE:
                stack.start(cfg, name)
            settings = resource.load()
            assert ensure_serving(settings, "acme", "concise") == 1
            base = resolve_base_model(cfg.train.base_model, cfg.home)
            v2 = AdapterStore(cfg.adapter_root).publish("acme", "concise", make_adapter(base, tmp / "v2", seed=5), {
                "parent_version": 1, "base_model_hash": base_model_hash(base), "data_window": None,
                "reward_spec_version": None, "config": {}, "metrics": {}})
            from tests.deploy.test_gateway import register

            register(settings, v2.version, "acme", "concise")
            assert registry.version_for_adapter(settings, "acme", "concise", 2) is not None
            yield settings, resource, lc, dc, dg.DagsterInstance.get()
        finally:
            for name in reversed(stack.SERVE):
                stack.stop(cfg, name)


def check_decided(cfg, report) -> None:
    """What the last canary step did is what the registry and the gateway say now."""
    from pipelines.adapters import promote, registry
    from pipelines.deploy.routing import Router

    live = Router(cfg.home / "deploy" / "routes.json").live("acme", "concise")
    champion = registry.adapter_for_alias(cfg, "acme", "concise", registry.CHAMPION)
    mv = registry.version_for_adapter(cfg, "acme", "concise", report.challenger)
    if report.action == "promoted":
        assert champion == report.challenger and live.version == report.challenger and live.canary is None
    elif report.action == "rolled_back":
        assert champion == report.champion and live.version == report.champion and live.canary is None
        assert mv.tags[promote.STATUS] == promote.REJECTED
        assert mv.tags["tracerl.canary.decision"] == "rollback"
    else:  # still running after the demo's rounds: the challenger serves its share
        assert report.action == "continue" and len(report.rounds) == 3
        assert live.canary is not None and live.canary.version == report.challenger
        assert mv.tags[promote.STATUS] == promote.CANARY


def test_an_operator_canary_runs_in_rounds_of_dagster_runs_and_its_decision_is_carried_out(served):
    from assets.canary_demo import CanaryReport, run_canary
    from pipelines.deploy.service import canary

    cfg, resource, lc, dc, instance = served
    out = canary(cfg, "start", "acme", "concise", version=2, share=dc.share, who="test", why="operator canary")
    assert "challenger" in out["registry"]
    report = run_canary(cfg, resource, lc, dc, CanaryReport("good", 2, 1, "operator"), instance, print)
    assert 1 <= len(report.rounds) <= dc.max_rounds
    assert all(r.sessions == 24 and r.failed == 0 for r in report.rounds)
    assert all(r.probe_requests > 0 and r.probe_failed == 0 for r in report.rounds)  # nothing failed, decided or not
    assert set().union(*(r.served for r in report.rounds)) == {1, 2}  # both arms served
    for job in ("ingest_job", "reward_job", "canary_job"):
        runs = instance.get_runs(dg.RunsFilter(job_name=job, statuses=[dg.DagsterRunStatus.SUCCESS]))
        assert len(runs) == len(report.rounds), job
    assert "sessions" in report.rounds[0].summary  # the step judged settled sessions per arm from the lake
    check_decided(cfg, report)
    if report.action == "continue":
        canary(cfg, "stop", "acme", "concise", who="test", why="the next test's canary")


def test_the_bad_candidate_is_a_step_back_from_v2_gated_until_one_nearly_passes_then_canaried(served):
    from assets.canary_demo import bad_canary, format_canary_report, gateway_counts
    from pipelines.adapters.store import AdapterStore

    cfg, resource, lc, dc, instance = served
    report = bad_canary(cfg, resource, lc, dc, 2, instance, print)
    bad = AdapterStore(cfg.adapter_root).get("acme", "concise", report.challenger)
    # Gated in order until one nearly passes (else the last tried); each a new version whose parent is v2.
    assert [t["version"] for t in report.tried] == list(range(3, 3 + len(report.tried)))
    assert [t["take_back"] for t in report.tried] == list(dc.take_back[:len(report.tried)])
    assert not any(t["nearly_passes"] for t in report.tried[:-1])
    assert report.tried[-1]["nearly_passes"] or len(report.tried) == len(dc.take_back)
    assert report.challenger == report.tried[-1]["version"] and bad.meta["parent_version"] == 2
    assert bad.meta["config"]["take_back"] == report.tried[-1]["take_back"]
    assert report.gate["outcome"] in ("promote", "reject") and report.gate["reasons"]
    assert ("operator" in report.how) != bool(report.gate["canary"])  # the gate's canary, or the operator's
    assert report.rounds and all(r.failed == 0 and r.probe_failed == 0 for r in report.rounds)
    check_decided(cfg, report)
    counts = gateway_counts(cfg, "acme", "concise", "2000")
    assert counts["failed_requests_during_swaps"] == 0 and counts["actions"]
    text = format_canary_report([report], counts)
    assert "bad" in text and f"v{report.challenger}" in text and "0 failed of" in text and "gated: take back" in text
