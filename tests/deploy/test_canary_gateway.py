"""The canary in the real gateway (issue #15): a challenger serves a share of the conversations,
sticky per conversation and per user, every turn records its arm in Kafka, the share changes and
the canary stops through the admin API and the CLI with zero failed requests, and a kill -9 of
the gateway mid-canary restores the split and both arms.

Real components: the tiny Llama on a real vLLM (CPU), the gateway as a background process (as
`tracerl up` starts it, so it can be killed), the session's Kafka. Each test has its own task.
"""

from __future__ import annotations

import copy
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.config import TracerlConfig, load_config
from tests.deploy.test_emitter import free_port, wait_for
from tests.deploy.test_gateway import HI, http, kafka_events
from tests.deploy.test_vllm import VLLM_PY, make_adapter

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PY.is_file(), reason="no .venv-vllm: run `make vllm-venv`")]


@dataclass
class Stack:
    cfg: TracerlConfig
    toml: Path
    key: str      # acme's API key
    admin: str
    sources: dict[int, Path]
    base_hash: str

    @property
    def url(self) -> str:
        from pipelines.deploy.service import read_gateway_state

        return read_gateway_state(self.cfg).url


@pytest.fixture(scope="module")
def stack(tmp_path_factory, broker):
    from pipelines.deploy.service import admin_key, start_gateway, stop_gateway, tenant_key
    from pipelines.deploy.vllm_server import start_vllm, stop_vllm
    from pipelines.models.registry import base_model_hash
    from pipelines.models.tiny import make_tiny_llama
    from pipelines.services.kafka import ensure_topic

    root = tmp_path_factory.mktemp("canary")
    home, toml = root / "home", root / "tracerl.toml"
    base = make_tiny_llama(root / "tiny", warmup_steps=20)
    sources = {seed: make_adapter(base, root / f"src-{seed}", seed=seed) for seed in (1, 2)}
    start_vllm(base, home=home, port=None, max_loras=4, max_lora_rank=16, max_cpu_loras=8,
               dtype="float32", start_timeout_s=300)
    # the gateway's fixed port (the kill -9 restart comes back on it) is picked once vLLM holds its own
    toml.write_text(f'home = "{home}"\n[kafka]\nbootstrap_servers = "{broker.bootstrap}"\n'
                    f'topic = "t-{uuid.uuid4().hex[:10]}"\n[gateway]\nport = {free_port()}\n'
                    f'drain_timeout_s = 60.0\n')
    with pytest.MonkeyPatch.context() as mp:
        for name in ("MLFLOW_TRACKING_URI", "TRACERL_HOME", "TRACERL_CONFIG"):
            mp.delenv(name, raising=False)
        cfg = load_config(toml)
    ensure_topic(cfg)
    key = tenant_key(cfg, "acme")
    try:
        start_gateway(cfg, config_path=str(toml))
        yield Stack(cfg, toml, key, admin_key(cfg), sources, base_model_hash(base))
    finally:
        stop_gateway(cfg)
        stop_vllm(cfg.home)


def route(s: Stack, task: str) -> None:
    """acme/<task> with v1 (champion, served) and v2 (published) on the tiny base."""
    from pipelines.adapters.store import AdapterStore
    from pipelines.deploy.service import swap

    store = AdapterStore(s.cfg.adapter_root)
    for seed in (1, 2):
        store.publish("acme", task, s.sources[seed], {"parent_version": None, "base_model_hash": s.base_hash,
                                                      "data_window": None, "reward_spec_version": None,
                                                      "config": {}, "metrics": {}})
    swap(s.cfg, "acme", task, 1, "test")


def chat(s: Stack, task: str, trace: str | None = None, user: str | None = None) -> tuple[int, dict]:
    body = {"model": task, "messages": HI, "max_tokens": 4,
            **({"tracerl": {"trace_id": trace}} if trace else {}), **({"user": user} if user else {})}
    return http(f"{s.url}/v1/chat/completions", s.key, body)


def conversation(s: Stack, task: str, turns: int = 3, user: str | None = None, with_trace: bool = False):
    """One conversation of ``turns`` turns continuing its trace: (version per turn, turn ids[, trace])."""
    trace, versions, turn_ids = None, [], []
    for _ in range(turns):
        status, out = chat(s, task, trace, user)
        assert status == 200, out
        trace = out["tracerl"]["trace_id"]
        versions.append(out["tracerl"]["adapter_version"])
        turn_ids.append(out["tracerl"]["turn_id"])
    return (versions, turn_ids, trace) if with_trace else (versions, turn_ids)


def admin(s: Stack, path: str, body: dict | None = None) -> tuple[int, dict]:
    return http(f"{s.url}{path}", s.admin, body, None if body is not None else "GET")


def test_conversations_stick_to_one_arm_and_every_turn_records_it(stack):
    s, task = stack, "split"
    route(s, task)
    status, rec = admin(s, "/admin/canary", {"tenant": "acme", "task": task, "version": 2, "share": 0.5,
                                              "why": "try v2 on half"})
    assert status == 200 and rec["ok"] and rec["from"] == "v1" and rec["to"] == "v2", rec
    convs = [conversation(s, task) for _ in range(24)]
    for versions, _ in convs:
        assert len(set(versions)) == 1, versions  # no conversation is served by both arms
    on_challenger = sum(v[0] == 2 for v, _ in convs)
    assert 3 <= on_challenger <= 21  # both arms serve; P(outside) < 3e-4 at share 0.5
    # a user's conversations share one arm, whatever their traces
    for user in ("u-1", "u-2", "u-3"):
        assert len({v for _ in range(3) for v in conversation(s, task, turns=1, user=user)[0]}) == 1
    ids = {t for _, turns in convs for t in turns}
    events = kafka_events(s.cfg, ids)
    assert set(events) == ids
    for versions, turns in convs:
        want = "challenger" if versions[0] == 2 else "champion"
        assert {events[t]["arm"] for t in turns} == {want}
        assert {events[t]["adapter_version"] for t in turns} == {versions[0]}
    status, listed = admin(s, "/admin/canary")
    (c,) = [c for c in listed["canaries"] if c["task"] == task]
    assert (c["champion"], c["challenger"], c["share"]) == (1, 2, 0.5)


def test_changing_the_share_moves_no_conversation_already_served(stack):
    from pipelines.deploy.service import canary

    s, task = stack, "share"
    route(s, task)
    canary(s.cfg, "start", "acme", task, version=2, share=0.5, who="test", why="half")
    traces = []
    for _ in range(16):
        status, out = chat(s, task)
        traces.append((out["tracerl"]["trace_id"], out["tracerl"]["adapter_version"]))
    assert {v for _, v in traces} == {1, 2}
    rec = canary(s.cfg, "share", "acme", task, share=0.02, who="test", why="fewer")
    assert rec["ok"] and rec["from"] == 0.5
    for trace, version in traces:  # each goes on with the version it started on
        assert chat(s, task, trace)[1]["tracerl"]["adapter_version"] == version
    new = [chat(s, task)[1]["tracerl"]["adapter_version"] for _ in range(20)]
    assert new.count(2) <= 4  # 2% now: P(>= 5 of 20) < 1e-4


def test_stopping_under_load_fails_no_request_and_unloads_the_challenger(stack):
    from pipelines.deploy import admin as vllm_admin
    from pipelines.deploy.vllm_server import read_state

    s, task = stack, "stop"
    route(s, task)
    assert admin(s, "/admin/canary", {"tenant": "acme", "task": task, "version": 2, "share": 0.5,
                                      "why": "half"})[0] == 200
    results, stop = [], threading.Event()

    def client() -> None:
        while not stop.is_set():
            status, out = chat(s, task)
            results.append((status, out.get("tracerl", {}).get("adapter_version", str(out))))

    threads = [threading.Thread(target=client) for _ in range(6)]
    for th in threads:
        th.start()
    try:
        assert wait_for(lambda: len({v for _, v in results}) == 2, 60)
        status, rec = admin(s, "/admin/canary/stop", {"tenant": "acme", "task": task, "why": "enough"})
        n = len(results)
        assert wait_for(lambda: len(results) >= n + 12, 60)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    assert status == 200 and rec["drained"] and rec["unloaded"], rec
    assert [r for r in results if r[0] != 200] == [] and rec["failed_requests"] == 0
    assert {v for _, v in results[n + 6:]} == {1}  # after the stop (and the 6 in flight): champion only
    assert f"acme/{task}/v2" not in {m["id"] for m in vllm_admin.list_models(read_state(s.cfg.home).base_url)}
    assert [c for c in admin(s, "/admin/canary")[1]["canaries"] if c["task"] == task] == []


def test_refusals_are_409s_that_say_why_and_change_nothing(stack):
    from tracerl.cli import main

    s, task = stack, "refuse"
    route(s, task)
    start = {"tenant": "acme", "task": task, "why": "try"}
    for body, words in [({**start, "version": 1}, "is the champion"),
                        ({**start, "version": 9}, "v9"),
                        ({**start, "task": "nosuch", "version": 2}, "serves no champion")]:
        status, out = admin(s, "/admin/canary", body)
        assert status == 409 and words in out["error"]["message"], out
    for share in (0, 1, 1.5, -0.1, "half"):
        status, out = admin(s, "/admin/canary", {**start, "version": 2, "share": share})
        assert status == 400 and out["error"]["param"] == "share", out
    status, out = admin(s, "/admin/canary/stop", start)
    assert status == 409 and "runs no canary" in out["error"]["message"]
    assert admin(s, "/admin/canary", {**start, "version": 2, "share": 0.2})[0] == 200
    status, out = admin(s, "/admin/canary", {**start, "version": 2})
    assert status == 409 and "already runs a canary of v2" in out["error"]["message"]
    status, out = http(f"{s.url}/admin/canary", s.key, {**start, "version": 2})  # a tenant key is not admin
    assert status == 403
    env = {"TRACERL_CONFIG": str(s.toml)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("TRACERL_HOME", raising=False)
        assert main(["canary", "share", "acme", task, "0.3", "--why", "more"]) == 0
        assert main(["canary", "start", "acme", task, "2", "--why", "again"]) == 1  # already running
        assert main(["canary", "stop", "acme", task, "--why", "done"]) == 0
        assert main(["canary", "stop", "acme", task, "--why", "again"]) == 1
    assert chat(s, task)[1]["tracerl"]["adapter_version"] == 1


def test_promoting_the_challenger_ends_the_canary(stack):
    from pipelines.deploy.service import canary, swap

    s, task = stack, "promote"
    route(s, task)
    canary(s.cfg, "start", "acme", task, version=2, share=0.3, who="test", why="try")
    rec = swap(s.cfg, "acme", task, 2, "test")
    assert rec["ok"] and rec["unloaded"], rec
    assert {chat(s, task)[1]["tracerl"]["adapter_version"] for _ in range(8)} == {2}
    assert [c for c in admin(s, "/admin/canary")[1]["canaries"] if c["task"] == task] == []


def test_a_kill_9_mid_canary_restores_the_split_and_both_arms(stack):
    """Conversations run while the gateway is killed -9 and restarted: the canary comes back with its
    id and share, each conversation goes on with its arm, and only requests in flight at the kill
    (or sent while it was down) fail."""
    from pipelines.deploy.service import read_gateway_state, start_gateway
    from pipelines.services import process

    s, task = stack, "kill"
    route(s, task)
    status, rec = admin(s, "/admin/canary", {"tenant": "acme", "task": task, "version": 2, "share": 0.5,
                                              "why": "half"})
    assert status == 200
    before = [c for c in admin(s, "/admin/canary")[1]["canaries"] if c["task"] == task]
    traces = {}
    for _ in range(12):
        out = chat(s, task)[1]["tracerl"]
        traces[out["trace_id"]] = out["adapter_version"]
    assert set(traces.values()) == {1, 2}
    outcomes, stop = [], threading.Event()  # (sent at, ended at, HTTP status or the error's name)

    def client() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                outcome = chat(s, task)[0]
            except Exception as err:  # noqa: BLE001 - refused while down, reset when killed mid-request
                outcome = type(err).__name__
                time.sleep(0.05)
            outcomes.append((t0, time.monotonic(), outcome))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for th in threads:
        th.start()
    try:
        assert wait_for(lambda: len(outcomes) >= 8, 60)
        state = read_gateway_state(s.cfg)
        killed = time.monotonic()
        os.kill(state.pid, signal.SIGKILL)
        child = process._children.pop(state.pid, None)
        if child is not None:
            child.wait(10)
        assert wait_for(lambda: read_gateway_state(s.cfg) is None, 10)
        start_gateway(s.cfg, config_path=str(s.toml))
        up = time.monotonic()
        assert wait_for(lambda: sum(t0 > up for t0, _, _ in outcomes) >= 8, 60)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    before_kill = [o for t0, _, o in outcomes if t0 < killed]
    assert before_kill.count(200) >= len(before_kill) - 4  # at most the 4 in flight at the kill failed
    assert {o for t0, _, o in outcomes if t0 > up} == {200}  # every request sent after the restart served
    after = [c for c in admin(s, "/admin/canary")[1]["canaries"] if c["task"] == task]
    assert [(c["id"], c["share"], c["challenger"]) for c in after] == \
        [(c["id"], c["share"], c["challenger"]) for c in before]
    for trace, version in traces.items():  # each conversation goes on with its arm
        assert chat(s, task, trace)[1]["tracerl"]["adapter_version"] == version


def served_canary(s: Stack, task: str, tmp_path: Path, n: int, challenger_liked: bool):
    """A canary of v2 at share 0.5 served ``n`` two-turn conversations through the gateway; the app
    sent feedback (the liked arm: thumbs up; the other: thumbs down, a regenerate, abandoned; the
    challenger's first turn: a failed tool call), then ingest and the real reward engine ran on a
    lake of this test's own. (config with that lake, since, {first turn id: version})."""
    import copy
    from datetime import datetime, timedelta, timezone

    from pipelines.deploy.service import GatewayClient
    from pipelines.ingest.run import run_ingest
    from pipelines.reward.engine import run_rewards

    route(s, task)
    since = datetime.now(timezone.utc) - timedelta(seconds=1)
    assert admin(s, "/admin/canary", {"tenant": "acme", "task": task, "version": 2, "share": 0.5,
                                      "why": "half"})[0] == 200
    app = GatewayClient(s.url, s.key)
    arms, traces = {}, set()
    for _ in range(n):
        versions, turns, trace_id = conversation(s, task, turns=2, with_trace=True)
        arms[turns[0]] = versions[0]
        traces.add(trace_id)
        liked = (versions[0] == 2) == challenger_liked
        for t in turns:
            app.feedback(trace_id, t, "thumbs", 1 if liked else -1)
        if versions[0] == 2:
            app.tool_call(trace_id, turns[0], "lookup", "error")
        if not liked:
            app.feedback(trace_id, turns[1], "regenerate")
        app.end(trace_id, "completed" if liked else "abandoned")
    assert set(arms.values()) == {1, 2}
    cfg = copy.deepcopy(s.cfg)
    cfg.lake_root, cfg.kafka.group_id = tmp_path / "lake", f"g-{uuid.uuid4().hex[:8]}"
    assert wait_for(lambda: run_ingest(cfg) is not None and _ended(cfg, traces), 60)
    run_rewards(cfg.lake, now=datetime.now(timezone.utc) + timedelta(days=7))
    return cfg, since, arms


def test_the_canary_s_settled_sessions_per_arm_come_from_the_lake(stack, tmp_path):
    """Served through the canary, rewarded by the real engine: each session is judged on its arm,
    its mean reward and guardrails read from the events (tool errors, regenerations, abandonment)."""
    from datetime import datetime, timedelta, timezone

    from pipelines.canary.decide import CHALLENGER_ARM, CHAMPION_ARM
    from pipelines.canary.sessions import canary_sessions

    cfg, since, arms = served_canary(stack, "lake", tmp_path, 12, challenger_liked=True)
    sessions = canary_sessions(cfg.lake, cfg.table_store, "acme", "lake", since, champion=1, challenger=2)
    assert len(sessions) == 12
    assert sorted(x.arm for x in sessions) == sorted(CHALLENGER_ARM if v == 2 else CHAMPION_ARM for v in arms.values())
    for x in sessions:
        if x.arm == CHALLENGER_ARM:
            assert x.reward > 0 and x.metrics["tool_error_rate"] == 1.0 and x.metrics["abandoned"] == 0.0
            assert x.metrics["regenerate_rate"] == 0.0
        else:
            assert x.reward < 0 and "tool_error_rate" not in x.metrics and x.metrics["abandoned"] == 1.0
            assert x.metrics["regenerate_rate"] == 0.5
        assert 0 < x.metrics["output_tokens"] <= 4 and x.metrics["latency_p95_s"] > 0
    assert canary_sessions(cfg.lake, cfg.table_store, "acme", "lake", datetime.now(timezone.utc) + timedelta(hours=1), 1, 2) == []
    assert canary_sessions(cfg.lake, cfg.table_store, "acme", "lake", since, champion=1, challenger=3) == \
        [x for x in sessions if x.arm == CHAMPION_ARM]  # turns of another challenger version are not this canary's


@pytest.mark.parametrize("liked, action", [(True, "promoted"), (False, "rolled_back")])
def test_a_canary_step_promotes_a_better_challenger_and_rolls_back_a_worse_one(stack, tmp_path, liked, action):
    """`tracerl canary check` on live rewards: the better challenger becomes champion through the
    registry (the swap ends the canary); the worse one is stopped and marked rejected, the champion
    untouched. Both are recorded: tags on the model version, the canary's MLflow run, aliases."""
    from pipelines.adapters import promote, registry
    from pipelines.adapters.version import tag_version
    from pipelines.canary.run import advance
    from pipelines.config import CanaryConfig
    from pipelines.tracking import client
    from tests.deploy.test_gateway import register

    task = f"step-{action}"
    cfg, _, _ = served_canary(stack, task, tmp_path, 20, challenger_liked=liked)
    first = register(cfg, 1, "acme", task)
    register(cfg, 2, "acme", task)
    promote.move_champion(cfg, "acme", task, first, action="deploy", who="test", why="first champion")
    cfg.canary = CanaryConfig(min_sessions=3, t_opt=20)
    step = advance(cfg, "acme", task)
    assert step.action == action, step.line()
    mv = registry.version_for_adapter(cfg, "acme", task, 2)
    assert mv.tags["tracerl.canary.decision"] == ("promote" if liked else "rollback")
    assert "reward" in mv.tags["tracerl.canary.reasons"]
    champion = promote.alias_version(cfg, "acme", task, registry.CHAMPION)
    assert tag_version(champion) == (2 if liked else 1)
    assert promote.alias_version(cfg, "acme", task, registry.CHALLENGER) is None
    if not liked:
        assert mv.tags[promote.STATUS] == promote.REJECTED
    run = client(cfg).get_run(step.detail["run_id"])
    assert run.data.tags["tracerl.canary.outcome"] == ("promote" if liked else "rollback")
    assert run.data.metrics["sessions_challenger"] + run.data.metrics["sessions_champion"] == 20
    served = {chat(stack, task)[1]["tracerl"]["adapter_version"] for _ in range(8)}
    assert served == {2 if liked else 1}  # one version again, for every conversation
    assert advance(cfg, "acme", task).action == "no_canary"


def _ended(cfg: TracerlConfig, traces: set[str]) -> bool:
    """Every trace's session end is in the lake (the app sent it last)."""
    from pipelines.lake.query import connect

    con = connect(cfg.lake)
    try:
        got = {r[0] for r in con.execute("SELECT trace_id FROM session_ends WHERE trace_id IN (SELECT unnest(?))",
                                         [list(traces)]).fetchall()}
    finally:
        con.close()
    return got == traces


def test_reconcile_starts_and_stops_the_canary_the_registry_names(stack):
    """Alias as truth for canaries too: `challenger` with status canary makes the `deployment`
    reconcile start it in the gateway (at canary.share), a decided one (canary_ended) stops it, and
    requests meanwhile never fail; the admin API's own start lands in the registry."""
    from pipelines.adapters import promote, registry
    from pipelines.deploy.reconcile import reconcile
    from tests.deploy.test_gateway import register

    task = "registry-truth"
    route(stack, task)
    first, second = register(stack.cfg, 1, "acme", task), register(stack.cfg, 2, "acme", task)
    promote.move_champion(stack.cfg, "acme", task, first, action="deploy", who="test", why="first champion")
    promote.enter_canary(stack.cfg, "acme", task, second, "gate", "passed")
    failures, stop = [], threading.Event()

    def load():
        while not stop.is_set():
            status, out = chat(stack, task)
            if status != 200:
                failures.append(out)

    t = threading.Thread(target=load)
    t.start()
    try:
        # the run's settings give this target its own share; the gateway process's file does not
        targeted = copy.deepcopy(stack.cfg)
        targeted.targets = {f"acme/{task}": {"canary": {"share": 0.3}}}
        (res,) = reconcile(targeted, [("acme", task)], who="dagster").targets
        assert res.outcome == "in_sync" and res.canary == "started v2", res.line()
        (live,) = [c for c in admin(stack, "/admin/canary")[1]["canaries"] if c["task"] == task]
        assert live["challenger"] == 2 and live["share"] == 0.3 != stack.cfg.canary.share and live["who"] == "dagster"
        assert reconcile(stack.cfg, [("acme", task)]).targets[0].canary == "v2 in sync"  # idempotent
        promote.end_canary(stack.cfg, "acme", task, second, promote.CANARY_ENDED, "expired")
        assert reconcile(stack.cfg, [("acme", task)]).targets[0].canary == "stopped v2"
        assert not [c for c in admin(stack, "/admin/canary")[1]["canaries"] if c["task"] == task]
        # an operator's start through the admin API writes the registry itself
        assert admin(stack, "/admin/canary", {"tenant": "acme", "task": task, "version": 2, "why": "again"})[0] == 200
        assert str(promote.canary_version(stack.cfg, "acme", task).version) == str(second)
        status, out = admin(stack, "/admin/canary/stop", {"tenant": "acme", "task": task, "why": "done"})
        assert status == 200 and "canary ended" in out["registry"], out
        assert promote.alias_version(stack.cfg, "acme", task, registry.CHALLENGER) is None
    finally:
        stop.set()
        t.join()
    assert failures == []
