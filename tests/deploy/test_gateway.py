"""The whole serve path against a real vLLM (tiny model, CPU) and the session's real Kafka:
tokens and logprobs reach Kafka, tenancy holds, vLLM's admin routes are unreachable, a deploy
under concurrent load fails no request, rollback, bad adapters, and Kafka down during traffic.

One vLLM for the module (~40 s to start); the gateway runs in a thread of the test process.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import jsonschema
import pytest

from pipelines.config import TracerlConfig
from pipelines.deploy import admin, schemas
from pipelines.config.gateway import GatewayConfig
from pipelines.deploy.service import GatewayClient, GatewayThread, build_gateway, swap_history
from pipelines.models.registry import base_model_hash
from pipelines.services.kafka import ensure_topic, start_broker, stop_broker
from pipelines.adapters.store import AdapterStore
from tests.conftest import make_config
from tests.deploy.test_emitter import free_port, wait_for
from tests.deploy.test_vllm import VLLM_PY, make_adapter

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PY.is_file(), reason="no .venv-vllm: run `make vllm-venv`")]
KEYS = {"acme": "acme-key-0123456789", "globex": "globex-key-0123456789"}
ADMIN = "admin-key-0123456789abc"
HI = [{"role": "user", "content": "Say hello."}]


def http(url: str, key: str | None, body: dict | None = None, method: str | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"{}")
        except ValueError:
            return e.code, {"raw": raw.decode(errors="replace")}


def publish(store: AdapterStore, base: Path, src: Path, base_hash: str, tenant: str = "acme", task: str = "support"):
    meta = {"parent_version": None, "base_model_hash": base_hash, "data_window": None,
            "reward_spec_version": None, "config": {}, "metrics": {}}
    return store.publish(tenant, task, src, meta)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, broker):
    from pipelines.deploy.vllm_server import start_vllm, stop_vllm
    from pipelines.models.tiny import make_tiny_llama

    root = tmp_path_factory.mktemp("gw")
    base = make_tiny_llama(root / "tiny", warmup_steps=20)
    vhome = root / "vllm-home"
    state = start_vllm(base, home=vhome, port=None, max_loras=4, max_lora_rank=16, max_cpu_loras=8,
                       dtype="float32", start_timeout_s=240)
    cfg = make_config(root, broker.bootstrap)
    ensure_topic(cfg)
    store, h = AdapterStore(cfg.adapter_root), base_model_hash(base)
    for seed in (1, 2, 3):  # v1, v2, v3 of acme/support
        publish(store, base, make_adapter(base, root / f"src-{seed}", seed=seed), h)
    publish(store, base, make_adapter(base, root / "src-g", seed=7), h, tenant="globex", task="support")
    # No sweep: test_kafka_down_... puts a gateway of another home on this vLLM, which a sweep of
    # either would take for a name nobody uses (gateways sharing replicas share a home).
    gcfg = GatewayConfig(api_keys=KEYS, admin_key=ADMIN, upstreams=[state.base_url], replay_interval_s=1.0,
                         sweep_interval_s=None)
    gw = GatewayThread(build_gateway(cfg, gcfg))
    yield dict(cfg=cfg, gcfg=gcfg, gw=gw, url=gw.url, vllm=state.base_url, base=base, store=store, hash=h, root=root)
    gw.stop()
    stop_vllm(vhome)


def swap(url: str, version: int, tenant: str = "acme", task: str = "support", who: str = "test"):
    """The reconciler's swap primitive (these tests exercise the swap itself, not the registry)."""
    return http(f"{url}/internal/swap", ADMIN, {"tenant": tenant, "task": task, "version": version, "who": who})


def kafka_events(cfg: TracerlConfig, ids: set[str]) -> dict[str, dict]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(cfg.kafka.topic, bootstrap_servers=cfg.kafka.bootstrap_servers,
                             auto_offset_reset="earliest", group_id=None, consumer_timeout_ms=1500)
    found: dict[str, dict] = {}
    for _ in range(20):
        for msg in consumer:
            obj = json.loads(msg.value)
            key = obj.get("turn_id") if obj["type"] == "model_turn" else obj["event_id"]
            if key in ids:
                found[key] = obj
        if set(found) >= ids:
            break
    consumer.close()
    return found


def test_serve_path_tokens_and_logprobs_reach_kafka(stack):
    url, cfg = stack["url"], stack["cfg"]
    assert swap(url, 1)[0] == 200 and swap(url, 1, tenant="globex")[0] == 200
    acme = GatewayClient(url, KEYS["acme"])
    out = acme.chat("support", HI, max_tokens=8, temperature=1.0, seed=1, logprobs=True, return_token_ids=True)
    t = out["tracerl"]
    assert out["model"] == "support" and t["adapter_version"] == 1 and out["choices"][0]["token_ids"]
    jsonschema.validate(out, schemas.openapi()["components"]["schemas"]["ChatCompletion"])  # what /openapi.json says
    plain = acme.chat("acme/support", HI, max_tokens=4)  # no logprobs asked: none returned
    assert plain["choices"][0]["logprobs"] is None and "token_ids" not in plain["choices"][0]
    # streaming: SSE chunks, tracerl in the first one, trace id in the header
    req = urllib.request.Request(f"{url}/v1/chat/completions", method="POST", data=json.dumps(
        {"model": "support", "messages": HI, "max_tokens": 6, "stream": True, "seed": 2,
         "tracerl": {"trace_id": t["trace_id"], "turn_index": 1}}).encode(),
        headers={"Authorization": f"Bearer {KEYS['acme']}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["X-Tracerl-Trace-Id"] == t["trace_id"]
        chunks = [json.loads(line[6:]) for line in resp.read().decode().split("\n")
                  if line.startswith("data: ") and line != "data: [DONE]"]
    stream_turn = chunks[0]["tracerl"]["turn_id"]
    fb = acme.feedback(t["trace_id"], t["turn_id"], "thumbs", 1.0)
    tc = acme.tool_call(t["trace_id"], t["turn_id"], "get_weather", "ok", arguments={"city": "Oslo"})

    got = kafka_events(cfg, {t["turn_id"], stream_turn, fb["event_id"], tc["event_id"]})
    turn = got[t["turn_id"]]
    assert turn["tenant"] == "acme" and turn["task"] == "support" and turn["adapter_version"] == 1
    assert turn["model"] == "acme/support/v1" and turn["trace_id"] == t["trace_id"]
    assert turn["output_token_ids"] == out["choices"][0]["token_ids"]
    assert turn["output_logprobs"] == [c["logprob"] for c in out["choices"][0]["logprobs"]["content"]]
    assert turn["prompt_token_ids"] == out["prompt_token_ids"] and turn["latency_ms"] > 0
    assert turn["sampling"] == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8, "seed": 1}
    streamed = got[stream_turn]
    assert streamed["turn_index"] == 1 and len(streamed["output_token_ids"]) == len(streamed["output_logprobs"]) > 0
    assert got[fb["event_id"]]["kind"] == "thumbs" and got[tc["event_id"]]["outcome"] == "ok"


def test_tenants_reach_only_their_own_models_and_traces(stack):
    url = stack["url"]
    if "support" not in [m["id"] for m in http(f"{url}/v1/models", KEYS["acme"])[1]["data"]]:
        swap(url, 1)
    status, out = http(f"{url}/v1/chat/completions", KEYS["acme"], {"model": "support", "messages": HI, "max_tokens": 2})
    assert status == 200
    assert http(f"{url}/v1/chat/completions", None, {"model": "support", "messages": HI})[0] == 401
    assert http(f"{url}/v1/chat/completions", "wrong-key-0123456789", {"model": "support", "messages": HI})[0] == 401
    assert http(f"{url}/v1/chat/completions", KEYS["globex"], {"model": "acme/support", "messages": HI})[0] == 404
    status, body = http(f"{url}/v1/feedback", KEYS["globex"], {"trace_id": out["tracerl"]["trace_id"],
                                                              "turn_id": out["tracerl"]["turn_id"], "kind": "thumbs"})
    assert status == 404 and "not one of this tenant's traces" in body["error"]["message"]
    forged = "0" * 32 + "-" + "0" * 16
    assert http(f"{url}/v1/feedback", KEYS["acme"], {"trace_id": forged, "turn_id": "x", "kind": "thumbs"})[0] == 404
    assert [m["id"] for m in http(f"{url}/v1/models", KEYS["globex"])[1]["data"]] == ["support"]
    # admin needs the admin key; vLLM's own admin routes do not exist on the gateway
    assert swap(url, 2)[0] == 200 and http(f"{url}/admin/deploy", KEYS["acme"], {"tenant": "acme"})[0] == 403
    assert http(f"{url}/internal/swap", KEYS["acme"], {"tenant": "acme"})[0] == 403
    assert http(f"{url}/admin/swaps", KEYS["acme"])[0] == 403
    for method, path in [("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"),
                         ("POST", "/adapters"), ("DELETE", "/adapters/acme%2Fsupport%2Fv2"),
                         ("POST", "/v1/completions")]:
        for key in (KEYS["acme"], ADMIN):
            status, _ = http(f"{url}{path}", key, {"lora_name": "x", "lora_path": str(stack["base"])}, method)
            assert status in (404, 405), (method, path, status)
    assert "x" not in {m["id"] for m in admin.list_models(stack["vllm"])}


def test_a_request_vllm_fails_is_counted_against_its_route(stack):
    """What the swap records' failed_requests count: a request vLLM answers with an error."""
    url = stack["url"]
    swap(url, 1)  # a live route (409 when it already is)

    def route():
        _, stats = http(f"{url}/admin/stats", ADMIN)
        return next((r["requests"], r["failed_requests"]) for r in stats["routes"]
                    if (r["tenant"], r["task"]) == ("acme", "support"))

    requests, failed = route()
    status, _ = http(f"{url}/v1/chat/completions", KEYS["acme"], {"model": "support", "messages": HI, "max_tokens": 2})
    assert status == 200 and route() == (requests + 1, failed)
    status, body = http(f"{url}/v1/chat/completions", KEYS["acme"],
                        {"model": "support", "messages": HI, "max_tokens": 10 ** 6})  # > max_model_len
    assert status == 400, body
    assert route() == (requests + 2, failed + 1)


def test_deploy_under_concurrent_load_fails_no_request(stack):
    url, vllm = stack["url"], stack["vllm"]
    swap(url, 1)
    results: list[tuple[int, int | str]] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            status, out = http(f"{url}/v1/chat/completions", KEYS["acme"],
                               {"model": "support", "messages": HI, "max_tokens": 6})
            results.append((status, out.get("tracerl", {}).get("adapter_version", str(out))))

    threads = [threading.Thread(target=client) for _ in range(6)]
    for th in threads:
        th.start()
    try:
        assert wait_for(lambda: len(results) >= 10, 60)
        swaps = [swap(url, v) for v in (2, 3)]
        n = len(results)
        assert wait_for(lambda: len(results) >= n + 10, 60)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    assert [s for s, _ in results if s != 200] == []
    assert {v for _, v in results} >= {2, 3}  # and 1 before the first swap
    assert [s for s, _ in swaps] == [200, 200] and all(r["drained"] and r["unloaded"] for _, r in swaps)
    # the swap records count the live requests that ended during each swap: none failed
    assert [r["failed_requests"] for _, r in swaps] == [0, 0] and sum(r["requests"] for _, r in swaps) > 0
    served = {m["id"] for m in admin.list_models(vllm)}
    assert "acme/support/v3" in served and not {"acme/support/v1", "acme/support/v2"} & served


def register(cfg: TracerlConfig, version: int, tenant: str = "acme", task: str = "support") -> str:
    """Adapter ``version`` registered in the real MLflow store as the learner does; the registry version."""
    from pipelines import tracking
    from pipelines.adapters import registry

    with tracking.run(cfg, "learner", tags={"tracerl.stage": "learner"}, params={}) as run:
        pass
    return registry.register_candidate(cfg, tenant, task, run.info.run_id, version, {})


def test_admin_deploy_and_rollback_move_the_champion_and_a_reconcile_after_changes_nothing(stack):
    """The admin routes are `tracerl deploy | rollback`: the registry's champion moves with who and
    why, the route follows, so nothing is left that the next `deployment` run would swap back."""
    from pipelines.adapters import promote, registry
    from pipelines.deploy.reconcile import reconcile
    from pipelines.tracking import client

    url, cfg, gw = stack["url"], stack["cfg"], stack["gw"].gateway
    rv = {v: register(cfg, v) for v in (1, 2, 3)}

    def live() -> int | None:
        route = gw.router.live("acme", "support")
        return route.version if route else None

    def champion() -> int | None:
        return registry.adapter_for_alias(cfg, "acme", "support", registry.CHAMPION)

    def act(action: str, **body):
        return http(f"{url}/admin/{action}", ADMIN, {"tenant": "acme", "task": "support", **body})

    for v in (2, 3):
        status, out = act("deploy", version=v, who="alice", why=f"ship v{v}")
        assert status == 200 and out["serving"]["outcome"] == "swapped", out
        assert champion() == v == live() and out["registry"]["reason"] == f"deploy by alice: ship v{v}"
    assert swap_history(cfg)[-1]["who"] == "alice"

    # a gate-rejected version needs force, like `tracerl deploy`
    promote.set_tags(cfg, "acme", "support", rv[1], {promote.DECISION: "reject", "tracerl.gate.reasons": "worse"})
    status, body = act("deploy", version=1, who="alice", why="try")
    assert status == 409 and body["error"]["code"] == "conflict" and body["error"]["param"] == "force" and \
        "the gate decided reject: worse" in body["error"]["message"] and champion() == 3 == live()

    status, out = act("rollback", who="bob", why="latency regression")
    assert status == 200 and (out["serving"]["before"], out["serving"]["after"]) == (3, 2)
    assert champion() == 2 == live() and swap_history(cfg)[-1]["who"] == "bob"
    assert GatewayClient(url, KEYS["acme"]).chat("support", HI, max_tokens=2)["choices"]
    t3 = client(cfg).get_model_version("acme.support", rv[3]).tags
    assert t3[promote.STATUS] == promote.ROLLED_BACK and t3["tracerl.rolled_back_why"] == "latency regression"
    assert http(f"{url}/admin/swaps", ADMIN)[1][-1] == swap_history(cfg)[-1]

    swaps = len(swap_history(cfg))  # what a `deployment` run does next: nothing
    assert [t.outcome for t in reconcile(cfg, [("acme", "support")]).targets] == ["in_sync"]
    assert len(swap_history(cfg)) == swaps and live() == 2

    status, out = act("deploy", version=1, who="carol", why="customer asked", force=True)
    assert status == 200 and champion() == 1 == live()
    assert client(cfg).get_model_version("acme.support", rv[1]).tags[promote.REASON] == \
        "forced deploy by carol: customer asked"
    # refusals name what was wrong, and change nothing
    assert act("deploy", version=2, who="x")[1]["error"]["param"] == "why"
    assert act("deploy", version=2, why="   ")[1]["error"]["param"] == "why"
    status, body = act("deploy", version=77, why="typo")
    assert status == 404 and body["error"]["param"] == "version" and "v77 is not registered" in \
        body["error"]["message"]
    assert http(f"{url}/admin/rollback", ADMIN, {"tenant": "globex", "task": "support", "why": "x"})[0] == 409
    assert champion() == 1 == live()


def test_bad_adapters_fail_the_deploy_clearly_and_the_old_one_keeps_serving(stack):
    url, store, base, root, h = stack["url"], stack["store"], stack["base"], stack["root"], stack["hash"]
    swap(url, 3)
    wrong_base = publish(store, base, root / "src-1", "f" * 64)
    pickled = publish(store, base, root / "src-2", h)
    (pickled.path / "adapter_model.bin").write_bytes(b"pickle")
    too_big = publish(store, base, make_adapter(base, root / "src-r32", r=32), h)  # > --max-lora-rank 16
    outside = root / "elsewhere"
    shutil.copytree(stack["store"].get("acme", "support", 1).path, outside)
    (store.root / "acme" / "support" / "v99").symlink_to(outside)
    cases = [(wrong_base.version, "trained on base model"), (pickled.version, "only safetensors"),
             (too_big.version, "greater than max_lora_rank"), (99, "outside the adapter store"),
             (1234, "not a published adapter")]
    for version, words in cases:
        status, body = swap(url, version)
        assert status == 409 and words in body["error"]["message"], (version, body)
        out = GatewayClient(url, KEYS["acme"]).chat("support", HI, max_tokens=2)
        assert out["tracerl"]["adapter_version"] == 3
    failed = [r for r in swap_history(stack["cfg"]) if not r["ok"]]
    assert len(failed) >= len(cases) and all(r["error"] for r in failed)


def test_kafka_down_during_traffic_fails_no_request_and_loses_no_turn(stack, tmp_path):
    """A gateway whose Kafka goes away: requests keep succeeding, turns spill to disk
    (counted), and reach Kafka when it is back. (The embedded broker keeps messages in memory,
    so the restarted one has only what was replayed.)"""
    own = TracerlConfig(home=tmp_path / "kafka")
    port = free_port()
    start_broker(own, port=port)
    cfg = TracerlConfig(home=tmp_path / "gw")
    cfg.adapter_root.parent.mkdir(parents=True)
    cfg.adapter_root.symlink_to(stack["cfg"].adapter_root)
    cfg.kafka.bootstrap_servers = f"127.0.0.1:{port}"
    cfg.kafka.topic = own.kafka.topic = f"t-{uuid.uuid4().hex[:8]}"
    gcfg = GatewayConfig(api_keys=KEYS, admin_key=ADMIN, upstreams=[stack["vllm"]], replay_interval_s=1.0,
                         sweep_interval_s=None)  # another home on the stack's vLLM (see the fixture)
    gw = GatewayThread(build_gateway(cfg, gcfg, max_block_ms=1000, bootstrap_timeout_ms=1000,
                                     request_timeout_ms=1000))
    try:
        assert swap(gw.url, 3)[0] == 200
        client = GatewayClient(gw.url, KEYS["acme"])
        [client.chat("support", HI, max_tokens=4) for _ in range(3)]
        emitter = gw.gateway.emitter
        assert wait_for(lambda: emitter.stats()["sent"] == 3, 30)
        stop_broker(own)
        t0 = time.monotonic()
        turns = [client.chat("support", HI, max_tokens=4)["tracerl"]["turn_id"] for _ in range(10)]
        print(f"10 requests with Kafka down: {time.monotonic() - t0:.2f}s")
        assert wait_for(lambda: emitter.stats()["spilled_failed"] + emitter.stats()["spilled_full"] == 10, 30), \
            emitter.stats()
        t0 = time.monotonic()
        start_broker(own, port=port)
        print(f"broker restart: {time.monotonic() - t0:.2f}s")
        assert wait_for(lambda: emitter.stats()["replayed"] == 10 and emitter.stats()["spill_files"] == 0, 60), \
            emitter.stats()
        print(f"replayed after {time.monotonic() - t0:.2f}s; {emitter.stats()}")
        assert set(kafka_events(cfg, set(turns))) == set(turns)
    finally:
        gw.stop()
        stop_broker(own)
