"""The gate's pass becomes a canary when ``canary.enabled`` (issue #15), against a real MLflow
registry: the registry, not the gateway, says what runs a canary (``challenger`` with status
``canary``); the learner waits while it runs; a canary rolled back ends the training branch; the
reconciler's plan for the gateway's canary, pure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipelines.adapters import promote as reg
from pipelines.adapters.registry import CHALLENGER, CHAMPION, adapter_for_alias, model_name
from pipelines.adapters.store import AdapterVersion
from pipelines.deploy.operations import record_canary
from pipelines.deploy.reconcile import plan_canary
from pipelines.gate.run import run_gate
from pipelines.tracking import client
from pipelines.train.branch import reset_reason
from pipelines.train.run import run_learner
from tests.gate.gate_fixtures import FakeBackend, candidate, policy_for, setup


def tags_of(cfg, tenant, task, version):
    return client(cfg).get_model_version(model_name(tenant, task), version).tags


def test_a_pass_enters_the_canary_and_the_learner_waits_for_it(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    cfg.canary = replace(cfg.canary, enabled=True)
    rv, av = candidate(cfg, tenant, task)
    r = run_gate(cfg, tenant, task, rv, backend=FakeBackend(policy_for({av: (3, True)}, tenant, task)), gate=gate,
                 training_prompts=[])
    assert r.decision.outcome == "promote" and r.canary and r.promoted is None, r.decision.reasons
    # no held-back traffic yet: the estimate refuses, and says so; the canary decides alone
    assert r.offpolicy is not None and r.offpolicy.verdict == "refuse"
    assert "off-policy estimate (refuse)" in r.decision.reasons[-1] and "entering the canary at 10%" in r.decision.reasons[-1]
    tags = tags_of(cfg, tenant, task, rv)
    assert tags[reg.STATUS] == reg.CANARY and tags["tracerl.offpolicy.verdict"] == "refuse"
    assert adapter_for_alias(cfg, tenant, task, CHALLENGER) == av
    assert adapter_for_alias(cfg, tenant, task, CHAMPION) is None  # nothing became champion
    assert str(reg.canary_version(cfg, tenant, task).version) == rv
    learner = run_learner(cfg, tenant, task)
    assert learner.status == "skipped" and f"a canary runs registry version {rv}" in learner.reason
    # the canary ends (rolled back): the registry says so and the learner resumes
    reg.end_canary(cfg, tenant, task, rv, reg.REJECTED, "canary rollback: reward worse")
    assert reg.canary_version(cfg, tenant, task) is None and adapter_for_alias(cfg, tenant, task, CHALLENGER) is None
    assert "a canary runs" not in run_learner(cfg, tenant, task).reason
    assert "canary ended (rejected)" in tags_of(cfg, tenant, task, rv)[reg.HISTORY]


def test_one_canary_per_target_and_the_admin_api_writes_the_registry(tmp_path, mlflow_server):
    cfg, _, tenant, task = setup(tmp_path, mlflow_server)
    (rv1, av1), (rv2, av2) = candidate(cfg, tenant, task), candidate(cfg, tenant, task)
    assert "is the challenger" in record_canary(cfg, tenant, task, av1, True, "alice", "try it")
    assert tags_of(cfg, tenant, task, rv1)[reg.STATUS] == reg.CANARY
    reg.enter_canary(cfg, tenant, task, rv2, "gate")  # a second canary replaces the first
    assert tags_of(cfg, tenant, task, rv1)[reg.STATUS] == reg.CANARY_ENDED
    assert str(reg.canary_version(cfg, tenant, task).version) == rv2
    history = tags_of(cfg, tenant, task, rv2)[reg.HISTORY]
    reg.enter_canary(cfg, tenant, task, rv2, "gate")  # idempotent: no second history entry
    assert tags_of(cfg, tenant, task, rv2)[reg.HISTORY] == history
    assert "canary ended" in record_canary(cfg, tenant, task, av2, False, "bob", "latency")
    assert reg.canary_version(cfg, tenant, task) is None
    assert tags_of(cfg, tenant, task, rv2)[reg.STATUS] == reg.CANARY_ENDED
    assert "keeps status" in record_canary(cfg, tenant, task, av2, False, "bob", "again")
    assert "not registered" in record_canary(cfg, tenant, task, 999, True, "bob", "ghost")


@pytest.mark.parametrize("desired, live, ended, champion, running, step", [
    (None, None, False, 1, True, "none"),
    (5, 5, False, 1, True, "in_sync"),
    (5, None, False, 1, True, "start"),
    (5, None, False, 1, False, "wait"),          # the gateway is down: nothing changes
    (6, 5, True, 1, True, "replace"),
    (None, 5, True, 1, True, "stop"),            # decided (rejected, expired, stopped): the gateway follows
    (None, 5, False, 1, True, "none"),           # a canary the registry does not know: left alone
    (5, None, False, 5, True, "none"),           # promoted: the flip ended it
])
def test_the_gateway_canary_follows_the_registry(desired, live, ended, champion, running, step):
    assert plan_canary(desired, live, ended, champion, running) == step


def test_a_canary_rolled_back_on_live_traffic_ends_its_branch(tmp_path):
    head = AdapterVersion("acme", "qa", 4, tmp_path, {"branch": {"depth": 1}, "metrics": {"kl": 0.01}})
    assert reset_reason(head, {}, max_kl=0.5, max_depth=8) is None
    why = reset_reason(head, {"tracerl.canary.decision": "rollback", "tracerl.canary.reasons": "reward worse"},
                       max_kl=0.5, max_depth=8)
    assert why is not None and why.startswith("canary: v4 was rolled back") and "reward worse" in why
    assert reset_reason(head, {"tracerl.canary.decision": "expire"}, max_kl=0.5, max_depth=8) is None
