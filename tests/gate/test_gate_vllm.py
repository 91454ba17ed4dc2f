"""The gate on a live vLLM (CPU, tiny Llama): candidate and champion adapters loaded side by side,
identical greedy requests, a decision recorded in a real MLflow registry. ~1-2 min on 2 cores."""

import json

import pytest

from pipelines.adapters import registry
from pipelines import tracking
from pipelines.deploy import admin
from pipelines.deploy.vllm_server import start_vllm, stop_vllm
from pipelines.config.gate import GateConfig
from pipelines.gate.evaluate import VllmBackend, evaluate_suite
from pipelines.gate.run import gate_name, run_gate
from pipelines.evals.suites import load_suites
from pipelines.adapters.store import AdapterStore
from tests.deploy.test_vllm import make_adapter, needs_vllm

PROMPTS = ["What is the weather in Oslo?", "Say hello.", "Tell me about a refund.", "Explain the invoice briefly.",
           "Help me with a password.", "What is the status of an order?"]


class Watching(VllmBackend):
    """Records which adapters vLLM lists while the gate generates."""

    seen: list[set[str]]

    def generate(self, name, messages, sampling, seed):
        if not hasattr(self, "seen"):
            self.seen = []
        self.seen.append({m["id"] for m in admin.list_models(self.base_url)})
        return super().generate(name, messages, sampling, seed)


@pytest.fixture(scope="module")
def live(tmp_path_factory, mlflow_server):
    from pipelines.config import TracerlConfig
    from pipelines.models.tiny import make_tiny_llama

    root = tmp_path_factory.mktemp("gate-vllm")
    base = make_tiny_llama(root / "tiny", warmup_steps=20)
    cfg = TracerlConfig(home=root / "home")
    cfg.mlflow.tracking_uri = mlflow_server
    state = start_vllm(base, home=cfg.home, port=None, max_loras=2, max_lora_rank=16, max_cpu_loras=4,
                       dtype="float32", start_timeout_s=240)
    yield cfg, base, root, state.base_url
    stop_vllm(cfg.home)


def publish_and_register(cfg, base, root, tenant, task, seed, parent=None):
    import mlflow

    src = make_adapter(base, root / f"src-{seed}", seed=seed, scale=0.2)
    av = AdapterStore(cfg.adapter_root).publish(tenant, task, src, {
        "parent_version": parent, "base_model_hash": "x", "data_window": {}, "reward_spec_version": [],
        "config": {}, "metrics": {}})
    with tracking.run(cfg, "learner", tags={}, params={}) as run:
        mlflow.log_artifacts(str(av.path), "adapter")
    return registry.register_candidate(cfg, tenant, task, run.info.run_id, av.version, {}), av.version


@needs_vllm
@pytest.mark.slow
def test_gate_serves_both_adapters_side_by_side_and_decides(live, tmp_path):
    cfg, base, root, url = live
    tenant, task = "live", "chat"
    folder = tmp_path / "evals" / tenant / task
    folder.mkdir(parents=True)
    (folder / "sim.toml").write_text('role = "primary"\n[scorer]\nkind = "similarity"\nmetric = "char_ratio"\n')
    (folder / "sim.jsonl").write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}],
                                                          "reference": "The weather is fine."}) + "\n"
                                              for p in PROMPTS))
    gate = GateConfig(suites_dir=str(tmp_path / "evals"), max_tokens=12, vllm_url=url, concurrency=4,
                      temperature=0.0, samples_per_item=1)
    rv1, av1 = publish_and_register(cfg, base, root, tenant, task, seed=1)
    registry.set_alias(cfg, tenant, task, registry.CHAMPION, rv1)  # an existing champion
    rv2, av2 = publish_and_register(cfg, base, root, tenant, task, seed=2, parent=av1)

    backend = Watching(url)
    r = run_gate(cfg, tenant, task, rv2, backend=backend, gate=gate, training_prompts=[])
    assert r.baseline == rv1 and r.decision.outcome in ("promote", "reject") and r.items == len(PROMPTS)
    both = {gate_name(tenant, task, av1), gate_name(tenant, task, av2)}
    assert backend.seen and all(both <= s for s in backend.seen)   # loaded side by side throughout
    assert not both & {m["id"] for m in admin.list_models(url)}    # and unloaded afterwards
    tags = tracking.client(cfg).get_model_version(registry.model_name(tenant, task), rv2).tags
    assert tags["tracerl.gate.decision"] == r.decision.outcome
    assert tracking.client(cfg).get_run(r.run_id).data.metrics["sim.n"] == len(PROMPTS)
    print(f"\ngate on live vLLM: {r.decision.outcome} in {r.seconds}s; {r.decision.reasons}")

    # identical sampling is reproducible: the same adapter scores the same twice (greedy, fixed seeds)
    suite = load_suites(gate.suites_dir, tenant, task)[0]
    name = gate_name(tenant, task, av2)
    backend.prepare(name, AdapterStore(cfg.adapter_root).get(tenant, task, av2).path)
    try:
        assert evaluate_suite(backend, name, suite, gate) == evaluate_suite(backend, name, suite, gate)
    finally:
        backend.release(name)
