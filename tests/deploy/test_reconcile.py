"""One truth for what serves: the registry's `champion` alias; deployment reconciles the gateway to it.

Real components: the tiny Llama served by a real vLLM (CPU), the real gateway as a background
process (as `tracerl up` starts it), a real MLflow store (SQLite under the home), the real gate
(scripted eval backend), the CLI's `main` and Dagster's `materialize`. Each test has its own
tenant on one shared stack.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.adapters import registry
from pipelines.config import TracerlConfig, load_config
from pipelines.deploy.reconcile import SERVED_FROM, SERVED_UNTIL, STOPPED, plan, reconcile
from pipelines.deploy.routing import Router
from pipelines.adapters import promote
from pipelines.tracking import client

# -- the decision, pure ------------------------------------------------------------------------

versions = st.one_of(st.none(), st.integers(1, 5))


@given(desired=versions, live=versions, running=st.booleans())
def test_plan_swaps_exactly_when_the_champion_differs_from_the_live_route(desired, live, running):
    step = plan(desired, live, running)
    if desired is None:
        assert step == "no_champion"  # the registry says nothing: never unroute on a guess
    elif desired == live:
        assert step == "in_sync"
    else:
        assert step == ("swap" if running else "wait")


@given(desired=versions, live=versions, running=st.booleans())
def test_plan_applied_once_is_in_sync_and_applying_it_again_changes_nothing(desired, live, running):
    def apply(live):
        return desired if plan(desired, live, running) == "swap" else live

    once = apply(live)
    assert apply(once) == once  # idempotent
    if running and desired is not None:
        assert plan(desired, once, running) == "in_sync"
    if not running:
        assert once == live  # the gateway down: nothing changes


# -- the stack ---------------------------------------------------------------------------------

@dataclass
class Stack:
    cfg: TracerlConfig
    toml: Path
    base: Path
    base_hash: str
    sources: dict[int, Path]   # seed -> a real PEFT adapter folder on the tiny base
    evals: Path

    @property
    def routes(self) -> Path:
        return self.cfg.home / "deploy" / "routes.json"

    def live(self, tenant: str, task: str) -> int | None:
        r = Router(self.routes).live(tenant, task)
        return r.version if r else None


@pytest.fixture(scope="module")
def stack(tmp_path_factory, broker):
    from pipelines.deploy.service import start_gateway, stop_gateway
    from pipelines.deploy.vllm_server import start_vllm, stop_vllm
    from pipelines.models.registry import base_model_hash
    from pipelines.models.tiny import make_tiny_llama
    from pipelines.services.kafka import ensure_topic
    from tests.deploy.test_vllm import VLLM_PY, make_adapter

    if not VLLM_PY.is_file():
        pytest.skip("no .venv-vllm: run `make vllm-venv`")
    root = tmp_path_factory.mktemp("reconcile")
    home = root / "home"
    toml = root / "tracerl.toml"
    toml.write_text(f'home = "{home}"\n[kafka]\nbootstrap_servers = "{broker.bootstrap}"\n'
                    f'topic = "t-{uuid.uuid4().hex[:10]}"\n[mlflow]\ntracking_uri = "sqlite:///{home}/mlflow.db"\n')
    with pytest.MonkeyPatch.context() as mp:  # the toml alone names the store, whatever ran before
        for name in ("MLFLOW_TRACKING_URI", "TRACERL_HOME", "TRACERL_CONFIG"):
            mp.delenv(name, raising=False)
        cfg = load_config(toml)
    ensure_topic(cfg)
    base = make_tiny_llama(root / "tiny", warmup_steps=20)
    sources = {seed: make_adapter(base, root / f"src-{seed}", seed=seed) for seed in (1, 2, 3)}
    start_vllm(base, home=cfg.home, port=None, max_loras=4, max_lora_rank=16, max_cpu_loras=8,
               dtype="float32", start_timeout_s=300)
    try:
        start_gateway(cfg, config_path=str(toml))  # a real background gateway, found through run/gateway.json
        yield Stack(cfg, toml, base, base_model_hash(base), sources, root / "evals")
    finally:
        stop_gateway(cfg)
        stop_vllm(cfg.home)


@pytest.fixture
def env(stack, monkeypatch):
    """The CLI reads the stack's config (main() also exports TRACERL_CONFIG: restored after)."""
    monkeypatch.setenv("TRACERL_CONFIG", str(stack.toml))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("TRACERL_HOME", raising=False)
    return stack


def tenant_task() -> tuple[str, str]:
    return f"t{uuid.uuid4().hex[:8]}", "qa"


def publish(s: Stack, tenant: str, task: str, seed: int, base_hash: str | None = None) -> tuple[str, int]:
    """A real adapter in the store, registered as the learner does: (registry version, adapter version)."""
    from pipelines import tracking
    from pipelines.adapters.store import AdapterStore

    av = AdapterStore(s.cfg.adapter_root).publish(tenant, task, s.sources[seed], {
        "parent_version": None, "base_model_hash": base_hash or s.base_hash, "data_window": None,
        "reward_spec_version": None, "config": {}, "metrics": {}})
    with tracking.run(s.cfg, "learner", tags={"tracerl.stage": "learner"}, params={}) as run:
        pass
    return registry.register_candidate(s.cfg, tenant, task, run.info.run_id, av.version, {}), av.version


def first_champion(s: Stack, tenant: str, task: str) -> tuple[str, int]:
    """Version 1 as the bootstrap makes it: champion without a gate, then served."""
    rv, av = publish(s, tenant, task, seed=1)
    registry.set_alias(s.cfg, tenant, task, registry.CHAMPION, rv)
    assert reconcile(s.cfg, [(tenant, task)]).targets[0].outcome == "swapped"
    return rv, av


def gate(s: Stack, tenant: str, task: str, rv: str, quality: int, review: bool = False):
    """The real gate on the version (scripted eval replies: quality 0 loses to the champion's 1, 3 wins)."""
    from pipelines.config.gate import GateConfig
    from pipelines.gate.run import run_gate
    from tests.gate.gate_fixtures import FakeBackend, policy_for, write_suites

    if not (s.evals / tenant / task).exists():
        write_suites(s.evals, tenant, task)
    av = int(client(s.cfg).get_model_version(registry.model_name(tenant, task), rv).tags["adapter_version"])
    g = GateConfig(suites_dir=str(s.evals), temperature=0.0, samples_per_item=1, review=review)
    return run_gate(s.cfg, tenant, task, rv, backend=FakeBackend(policy_for({av: (quality, True)}, tenant, task)),
                    gate=g, training_prompts=[]).decision.outcome


def tags(s: Stack, tenant: str, task: str, rv: str) -> dict[str, str]:
    return client(s.cfg).get_model_version(registry.model_name(tenant, task), rv).tags


def champion(s: Stack, tenant: str, task: str) -> int | None:
    return registry.adapter_for_alias(s.cfg, tenant, task, registry.CHAMPION)


def cli(*argv: str) -> int:
    from tracerl.cli import main

    return main(list(argv))


def deployment_run(s: Stack, tenant: str, task: str) -> dict:
    """One Dagster run of the `deployment` asset for the target, as the schedule or a loop run makes it."""
    from assets.deploy import deployment
    from assets.resources import TracerlResource, service_resources
    from assets.targets import materialize_target

    result = materialize_target([deployment], tenant, task,
                                resources=service_resources(TracerlResource(config_path=str(s.toml))))
    return {k: v.value for k, v in result.asset_materializations_for_node("deployment")[0].metadata.items()}


def swap_count(s: Stack) -> int:
    from pipelines.deploy.service import swap_history

    return len(swap_history(s.cfg))


# -- the acceptance test of #14 ------------------------------------------------------------------

@pytest.mark.slow
def test_rollback_moves_alias_and_route_and_the_next_deployment_run_changes_nothing(env, capsys):
    s, (tenant, task) = env, tenant_task()
    rv1, av1 = first_champion(s, tenant, task)
    rv2, av2 = publish(s, tenant, task, seed=2)
    assert gate(s, tenant, task, rv2, quality=3) == "promote"      # the gate moves the alias only ...
    assert s.live(tenant, task) == av1
    meta = deployment_run(s, tenant, task)                          # ... deployment serves it
    assert meta["swapped"] == 1 and meta["versions_after"] == {f"{tenant}/{task}": f"v{av2}"}
    assert tags(s, tenant, task, rv1)[STOPPED] == f"replaced by v{av2} (promote by gate)"

    assert cli("rollback", tenant, task, "--who", "alice", "--why", "latency regression") == 0
    out = capsys.readouterr().out
    assert champion(s, tenant, task) == av1 and s.live(tenant, task) == av1
    assert f"now serving v{av1} (was v{av2}): rollback by alice: latency regression" in out
    t1, t2 = tags(s, tenant, task, rv1), tags(s, tenant, task, rv2)
    assert t2[promote.STATUS] == promote.ROLLED_BACK
    assert t2[STOPPED] == f"replaced by v{av1} (rollback by alice: latency regression)" and t2[SERVED_UNTIL]
    assert t1[SERVED_FROM] >= t2[SERVED_FROM] and SERVED_UNTIL not in t1 and STOPPED not in t1  # serving again
    assert "became champion" in t1[promote.HISTORY].split(" | ")[-1] and "alice" in t1[promote.HISTORY]
    assert "lost champion" in t2[promote.HISTORY].split(" | ")[-1] and "latency regression" in t2[promote.HISTORY]

    swaps = swap_count(s)
    meta = deployment_run(s, tenant, task)                          # the hourly run does not undo it
    assert meta["swapped"] == 0 and meta["failed_swaps"] == 0
    assert meta["versions_before"] == meta["versions_after"] == {f"{tenant}/{task}": f"v{av1}"}
    assert meta["champions"] == {f"{tenant}/{task}": f"v{av1}"}
    assert swap_count(s) == swaps and champion(s, tenant, task) == av1

    # nothing automatic makes the rolled-back version champion again
    with pytest.raises(promote.RegistryError, match="rolled back"):
        promote.promote(s.cfg, tenant, task, rv2)
    client(s.cfg).set_model_version_tag(registry.model_name(tenant, task), rv2, "tracerl.approved", "true")
    assert promote.all_pending_approvals(s.cfg, "tracerl.approved") == []
    assert deployment_run(s, tenant, task)["swapped"] == 0 and s.live(tenant, task) == av1


@pytest.mark.slow
def test_admin_deploy_over_http_moves_the_alias_and_the_next_deployment_run_changes_nothing(env):
    """The gateway process's /admin/deploy is `tracerl deploy`: the alias moves with who and why, the
    gateway reconciles itself, and the hourly `deployment` run finds nothing to swap back."""
    from pipelines.deploy.service import admin_key, read_gateway_state
    from tests.deploy.gateway_http import call

    s, (tenant, task) = env, tenant_task()
    rv1, av1 = first_champion(s, tenant, task)
    rv2, av2 = publish(s, tenant, task, seed=2)
    status, out = call(f"{read_gateway_state(s.cfg).url}/admin/deploy", admin_key(s.cfg),
                       {"tenant": tenant, "task": task, "version": av2, "who": "dana", "why": "hotfix"})
    assert status == 200 and out["serving"]["outcome"] == "swapped", out
    assert champion(s, tenant, task) == av2 == s.live(tenant, task)
    assert tags(s, tenant, task, rv2)[promote.REASON] == "deploy by dana: hotfix"
    assert tags(s, tenant, task, rv1)[STOPPED] == f"replaced by v{av2} (deploy by dana: hotfix)"

    swaps = swap_count(s)
    meta = deployment_run(s, tenant, task)
    assert meta["swapped"] == 0 and meta["versions_after"] == {f"{tenant}/{task}": f"v{av2}"}
    assert swap_count(s) == swaps and s.live(tenant, task) == av2


@pytest.mark.slow
def test_reconcile_twice_is_a_no_op(env):
    s, (tenant, task) = env, tenant_task()
    rv, av = first_champion(s, tenant, task)
    before, swaps = tags(s, tenant, task, rv), swap_count(s)
    report = reconcile(s.cfg, [(tenant, task)])
    assert [(t.outcome, t.before, t.after) for t in report.targets] == [("in_sync", av, av)]
    assert not report.changed and swap_count(s) == swaps and tags(s, tenant, task, rv) == before
    assert report.lines() == [f"{tenant}/{task}: v{av} serves, in sync"]


@pytest.mark.slow
def test_two_reconciles_at_once_swap_once_and_neither_reports_a_failure(env):
    """An operator's command and the hourly run racing on the same route."""
    from concurrent.futures import ThreadPoolExecutor

    s, (tenant, task) = env, tenant_task()
    rv, av = publish(s, tenant, task, seed=2)
    registry.set_alias(s.cfg, tenant, task, registry.CHAMPION, rv)
    swaps = swap_count(s)
    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(lambda who: reconcile(s.cfg, [(tenant, task)], who=who), ["cli", "dagster"]))
    assert sorted(r.targets[0].outcome for r in reports) == ["in_sync", "swapped"]
    assert s.live(tenant, task) == av and swap_count(s) - swaps <= 2   # the loser's refused attempt is logged


@pytest.mark.slow
def test_deploy_refuses_a_gate_rejected_version_unless_forced_and_records_the_override(env, capsys):
    s, (tenant, task) = env, tenant_task()
    rv1, av1 = first_champion(s, tenant, task)
    rv2, av2 = publish(s, tenant, task, seed=2)
    assert gate(s, tenant, task, rv2, quality=0) == "reject"
    reasons = tags(s, tenant, task, rv2)["tracerl.gate.reasons"]

    assert cli("deploy", tenant, task, str(av2), "--who", "bob", "--why", "try it") == 2
    err = capsys.readouterr().err
    assert "refused" in err and "the gate decided reject" in err and reasons[:60] in err and "--force" in err
    assert champion(s, tenant, task) == av1 and s.live(tenant, task) == av1

    assert cli("deploy", tenant, task, str(av2), "--who", "bob", "--why", "customer asked", "--force") == 0
    assert champion(s, tenant, task) == av2 and s.live(tenant, task) == av2
    t2 = tags(s, tenant, task, rv2)
    assert t2["tracerl.forced_override"].startswith("by bob: customer asked (over: the gate decided reject")
    assert t2[promote.REASON] == "forced deploy by bob: customer asked" and t2[SERVED_FROM]
    assert tags(s, tenant, task, rv1)[STOPPED] == f"replaced by v{av2} (forced deploy by bob: customer asked)"

    assert cli("deploy", tenant, task, "99", "--why", "typo") == 1      # not registered: a clear error
    assert "adapter v99 is not registered" in capsys.readouterr().err


@pytest.mark.slow
def test_approve_serves_a_held_challenger_and_reject_drops_one(env, capsys):
    s, (tenant, task) = env, tenant_task()
    _, av1 = first_champion(s, tenant, task)
    rv2, av2 = publish(s, tenant, task, seed=2)
    assert gate(s, tenant, task, rv2, quality=2, review=True) == "hold"
    assert registry.adapter_for_alias(s.cfg, tenant, task, registry.CHALLENGER) == av2
    assert s.live(tenant, task) == av1 and deployment_run(s, tenant, task)["swapped"] == 0  # held: not served

    assert cli("approve", tenant, task, str(av2), "--who", "carol", "--why", "read the samples") == 0
    assert champion(s, tenant, task) == av2 and s.live(tenant, task) == av2
    assert registry.adapter_for_alias(s.cfg, tenant, task, registry.CHALLENGER) is None
    assert tags(s, tenant, task, rv2)[promote.REASON] == "approve by carol: read the samples"

    rv3, av3 = publish(s, tenant, task, seed=3)
    assert gate(s, tenant, task, rv3, quality=3, review=True) == "hold"
    assert cli("reject", tenant, task, str(av3), "--who", "carol", "--why", "too terse") == 0
    t3 = tags(s, tenant, task, rv3)
    assert t3[promote.STATUS] == promote.REJECTED and t3["tracerl.rejected_by"] == "carol"
    assert registry.adapter_for_alias(s.cfg, tenant, task, registry.CHALLENGER) is None
    assert champion(s, tenant, task) == av2 and s.live(tenant, task) == av2
    capsys.readouterr()
    assert cli("approve", tenant, task, str(av3), "--why", "changed my mind") == 1   # no longer held
    assert "not awaiting approval (status rejected" in capsys.readouterr().err
    assert cli("deploy", tenant, task, str(av3), "--why", "anyway") == 2              # a reviewer's no counts too
    assert "rejected in review by carol: too terse" in capsys.readouterr().err


@pytest.mark.slow
def test_a_failed_swap_keeps_the_old_version_and_the_other_routes_still_reconcile(env):
    s = env
    (bad, task), (good, _) = tenant_task(), tenant_task()
    rv1, av1 = first_champion(s, bad, task)
    rv2, av2 = publish(s, bad, task, seed=2, base_hash="0" * 64)   # trained on another base: vLLM must refuse
    promote.promote(s.cfg, bad, task, rv2)
    grv, gav = publish(s, good, task, seed=3)
    registry.set_alias(s.cfg, good, task, registry.CHAMPION, grv)

    report = reconcile(s.cfg, [(bad, task), (good, task)])
    failed, swapped = report.targets
    assert (failed.outcome, failed.before, failed.after, failed.champion) == ("failed", av1, av1, av2)
    assert "trained on base model" in failed.reason and "keeps serving" in failed.line()
    assert s.live(bad, task) == av1 and SERVED_FROM not in tags(s, bad, task, rv2)
    assert SERVED_UNTIL not in tags(s, bad, task, rv1)                 # it never stopped serving
    assert (swapped.outcome, swapped.after) == ("swapped", gav) and s.live(good, task) == gav


# -- no gateway ----------------------------------------------------------------------------------

def _registered(cfg: TracerlConfig, tenant: str, task: str, version: int) -> str:
    """A registered adapter version (files enough for the registry; this gateway is never up)."""
    from pipelines import tracking

    folder = cfg.adapter_root / tenant / task / f"v{version}"
    folder.mkdir(parents=True)
    (folder / "READY").touch()
    (folder / "tracerl.json").write_text(f'{{"version": {version}, "tenant": "{tenant}", "task": "{task}"}}')
    with tracking.run(cfg, "learner", tags={}, params={}) as run:
        pass
    return registry.register_candidate(cfg, tenant, task, run.info.run_id, version, {})


def test_gateway_down_the_alias_moves_and_the_route_waits(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("TRACERL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRACERL_CONFIG", str(tmp_path / "absent.toml"))
    cfg = load_config()
    tenant, task = "acme", "support"
    rv1, rv2 = _registered(cfg, tenant, task, 1), _registered(cfg, tenant, task, 2)
    registry.set_alias(cfg, tenant, task, registry.CHAMPION, rv1)
    promote.promote(cfg, tenant, task, rv2)
    routes = cfg.home / "deploy" / "routes.json"
    Router(routes).flip(tenant, task, 2, str(cfg.adapter_root / tenant / task / "v2"))
    before = routes.read_text()

    assert cli("rollback", tenant, task, "--who", "alice", "--why", "bad answers") == 0
    assert "waiting for gateway to serve v1 (v2 routed)" in capsys.readouterr().out
    assert registry.adapter_for_alias(cfg, tenant, task, registry.CHAMPION) == 1
    assert routes.read_text() == before                                   # nothing changed in serving
    for rv in (rv1, rv2):
        assert not {SERVED_FROM, SERVED_UNTIL, STOPPED} & set(client(cfg).get_model_version("acme.support", rv).tags)
    report = reconcile(cfg)                                                # every target, still waiting
    assert [(t.key, t.outcome) for t in report.targets] == [("acme/support", "waiting")]
    assert not report.gateway_running and routes.read_text() == before


@pytest.mark.slow
def test_tracerl_gate_decides_the_newest_ungated_candidate_on_the_real_vllm(env, tmp_path, monkeypatch, capsys):
    """`tracerl gate` runs the real gate (the stack's vLLM, private suites) on the newest candidate the
    gate has not decided, records the decision on its model version, serves it only if promoted, and
    then has nothing left to gate."""
    import json

    from tests.gate.gate_fixtures import write_suites

    tenant, task = tenant_task()
    write_suites(tmp_path / "evals", tenant, task)
    toml = tmp_path / "tracerl.toml"
    toml.write_text(env.toml.read_text() + f'[train]\nbase_model = "{env.base}"\n'
                    f'[gate]\nsuites_dir = "{tmp_path / "evals"}"\nmax_tokens = 16\n')
    monkeypatch.setenv("TRACERL_CONFIG", str(toml))
    _, v1 = first_champion(env, tenant, task)
    rv2, v2 = publish(env, tenant, task, seed=2)
    capsys.readouterr()

    assert cli("gate", "--tenant", tenant, "--task", task, "--who", "ci") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["registry_version"] == str(rv2) and summary["outcome"] in ("promote", "reject", "hold")
    assert tags(env, tenant, task, rv2)["tracerl.gate.decision"] == summary["outcome"]
    served = v2 if summary["outcome"] == "promote" else v1
    assert summary["serving"] == served == champion(env, tenant, task) == env.live(tenant, task)

    assert cli("gate", "--tenant", tenant, "--task", task) == 2  # nothing waits for the gate now
    assert "no registered version waits" in capsys.readouterr().err
    assert cli("gate", "--tenant", tenant, "--task", task, "--version", "99") == 2
