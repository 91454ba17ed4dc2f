"""`tracerl forget` after the served path (issue #42), end to end: a canary string in one user's
chats, tool calls and feedback through a real gateway (its own home, in front of the boundary's
vLLM and the session's Kafka), then ingest, the reward stage, a learner iteration on the tiny Llama
and the gate's review table of recent real prompts (its `side_by_side` through vLLM, candidate
adapter loaded, logged as the gate logs it). After `forget` and its vacuum, a search of every file
under the home (the lake, the gateway's journal and spill, the caches, the MLflow store and its
artifacts: Parquet decompressed, SQLite rows read, raw bytes) finds the canary nowhere, and the
other user's rows are all still there. (tests/privacy/test_forget.py covers each store, the marks,
the retrain policy and kill -9 on landed traffic, faster.)"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from tests.conftest import make_config
from tests.deploy.conftest import ADMIN
from tests.deploy.gateway_http import call
from tests.privacy.test_forget import _found

pytestmark = pytest.mark.slow
TENANT = "forgetco"  # its own tenant: its adapter name (forgetco/support/v1) is no boundary gateway's
KEY = {TENANT: "forgetco-key-0123456789"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _counts(cfg, trace_ids: set[str]) -> dict[str, int]:
    """Rows of these traces in the lake's views (the other user's, before and after)."""
    from pipelines.lake.query import connect

    con = connect(cfg.lake, cfg.table_store)
    ids = ", ".join(f"'{t}'" for t in sorted(trace_ids))
    return {v: con.execute(f"SELECT count(*) FROM {v} WHERE trace_id IN ({ids})").fetchone()[0]
            for v in ("turns", "feedback", "tool_calls", "rewards")}


def test_forget_after_gateway_ingest_rewards_learner_and_review_table_leaves_no_trace(boundary, broker, tmp_path):
    import mlflow

    from pipelines import tracking
    from pipelines.adapters import registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.config.gateway import GatewayConfig
    from pipelines.config.train import LoraSettings, OptimizerSettings, TrainConfig
    from pipelines.deploy.service import GatewayThread, build_gateway
    from pipelines.evals.contamination import eval_hashes
    from pipelines.gate.evaluate import VllmBackend
    from pipelines.gate.side_by_side import ARTIFACT, recent_prompts, side_by_side
    from pipelines.ingest.run import run_ingest
    from pipelines.models.registry import base_model_hash
    from pipelines.reward.engine import run_rewards
    from pipelines.rights.forget import forget
    from pipelines.services.kafka import ensure_topic
    from pipelines.train.run import run_learner
    from tests.deploy.test_vllm import make_adapter

    canary = f"canary{uuid.uuid4().hex}"
    base = boundary.root / "tiny"
    cfg = make_config(tmp_path, broker.bootstrap)
    ensure_topic(cfg)
    cfg.gate.suites_dir = str(tmp_path / "evals")
    cfg.train = TrainConfig(base_model=str(base), seed=0, lora=LoraSettings(r=8, alpha=16),  # make_adapter's shape
                            optimizer=OptimizerSettings(lr=1e-3, steps_per_iteration=1, micro_batch_size=16))
    cfg.learner.min_new_turns = 4
    store = AdapterStore(cfg.adapter_root)
    store.publish(TENANT, "support", make_adapter(base, tmp_path / "src", seed=3),
                  {"parent_version": None, "base_model_hash": base_model_hash(base), "data_window": None,
                   "reward_spec_version": None, "config": {}, "metrics": {}})
    with tracking.run(cfg, "seed adapter", tags={}, params={}) as run:  # v1 is the registry's champion
        registry.set_alias(cfg, TENANT, "support", registry.CHAMPION,
                           registry.register_candidate(cfg, TENANT, "support", run.info.run_id, 1, {}))
    # no sweep: this gateway shares the boundary's vLLM and must not unload the adapters it does not route
    gw = GatewayThread(build_gateway(cfg, GatewayConfig(api_keys=KEY, admin_key=ADMIN, upstreams=[boundary.vllm],
                                                        replay_interval_s=1.0, sweep_interval_s=None)))
    try:
        gw.gateway.deployer.promote(TENANT, "support", 1, "test")
        traces: dict[str, set[str]] = {"alice": set(), "bob": set()}
        for user in ("alice", "bob"):
            said = f" {canary}" if user == "alice" else ""
            for k in range(3):
                messages = [{"role": "user", "content": f"Question {k} from {user}{said}?"}]
                if k == 2:  # a tool call the app ran, its arguments and result quoting the canary
                    cid = f"call_{user}_{uuid.uuid4().hex[:8]}"
                    messages += [{"role": "assistant", "content": None, "tool_calls": [{
                                     "id": cid, "type": "function", "function": {
                                         "name": "get_weather", "arguments": f'{{"city": "Oslo{said}"}}'}}]},
                                 {"role": "tool", "tool_call_id": cid, "content": f'{{"temp_c": 4, "note": "{said}"}}'}]
                status, out = call(f"{gw.url}/v1/chat/completions", KEY[TENANT],
                                   {"model": "support", "messages": messages, "max_tokens": 8, "user": user,
                                    **({"tools": [WEATHER]} if k == 2 else {})})
                assert status == 200, out
                t = out["tracerl"]
                traces[user].add(t["trace_id"])
                status, fb = call(f"{gw.url}/v1/feedback", KEY[TENANT], {
                    "trace_id": t["trace_id"], "turn_id": t["turn_id"], "kind": "thumbs", "value": 1 if k else -1})
                assert status == 202, fb
                status, fb = call(f"{gw.url}/v1/feedback", KEY[TENANT], {
                    "trace_id": t["trace_id"], "turn_id": t["turn_id"], "kind": "comment", "text": f"thanks{said}"})
                assert status == 202, fb
    finally:
        gw.stop()  # its emitter delivers what it holds first

    run_ingest(cfg)
    run_rewards(cfg.lake, now=datetime.now(timezone.utc) + timedelta(days=2))
    r = run_learner(cfg, TENANT, "support")
    assert r.status == "trained", r
    backend = VllmBackend(boundary.vllm, cfg.serve.served_model_name)
    backend.prepare("forget-test-candidate", store.get(TENANT, "support", r.adapter_version).path)
    try:
        prompts = recent_prompts(cfg, TENANT, "support", 8, eval_hashes(cfg.gate.suites_dir, TENANT, "support"))
        table = side_by_side(backend, "forget-test-candidate", cfg.serve.served_model_name, prompts, None, cfg.gate)
    finally:
        backend.release("forget-test-candidate")
    assert any(canary in p for p in table["prompt"])
    with tracking.run(cfg, f"gate {TENANT}/support", tags={"tracerl.stage": "gate"}, params={}):
        mlflow.log_table(data=table, artifact_file=ARTIFACT)

    where = _found(cfg.home, canary)
    print("the canary before forget:", *where, sep="\n  ")
    for part in ("lake/events", "mlartifacts"):  # it reached the lake and the review table before
        assert any(part in w for w in where), (part, where)
    bob_before = _counts(cfg, traces["bob"])
    assert bob_before["turns"] == 3 and bob_before["feedback"] == 6 and bob_before["rewards"] >= 3

    receipt = forget(cfg, TENANT, "alice", "dpo@forgetco")
    assert receipt.status == "done" and receipt.counts["lake.events"] > 0, receipt.counts
    assert [v["version"] for v in receipt.versions_marked] == [r.adapter_version]
    assert _found(cfg.home, canary) == []
    assert _counts(cfg, traces["alice"]) == {"turns": 0, "feedback": 0, "tool_calls": 0, "rewards": 0}
    assert _counts(cfg, traces["bob"]) == bob_before

    # an event of hers still in Kafka when the forget ran (sent before it) is not landed again; what
    # she sends after it is new data and lands, as does everyone else's
    from pipelines.contract.events import Message, ModelTurn
    from pipelines.ingest.producer import TraceProducer

    asked = datetime.fromisoformat(receipt.requested_at)
    env = {"tenant": TENANT, "app": "late", "task": "support", "model": "m", "turn_index": 0}
    late = [ModelTurn(**env, trace_id=next(iter(traces["alice"])), user="alice", event_time=(asked - timedelta(
                          seconds=1)).isoformat(), input_messages=[Message(role="user", content=f"late {canary}")],
                      output_text="x"),
            ModelTurn(**env, trace_id="new-trace-alice", user="alice", event_time=(asked + timedelta(seconds=1)).isoformat(),
                      input_messages=[Message(role="user", content="back again")], output_text="y"),
            ModelTurn(**env, trace_id="new-trace-bob", user="bob", event_time=asked.isoformat(),
                      input_messages=[Message(role="user", content="still here")], output_text="z")]
    with TraceProducer(cfg) as producer:
        for e in late:
            producer.send(e)
    result = run_ingest(cfg)
    assert (result.landed, result.forgotten) == (2, 1), result
    assert _found(cfg.home, canary) == []
