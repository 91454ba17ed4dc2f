"""One real gateway in front of one real vLLM (tiny model, CPU) and the session's Kafka, shared by
the boundary tests (schemas fuzz, hostile corpus, cross-tenant): acme/support and globex/support
are live, each tenant has a key, the admin key is known."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.config import TracerlConfig
from tests.conftest import make_config

KEYS = {"acme": "acme-key-0123456789", "globex": "globex-key-0123456789"}
ADMIN = "admin-key-0123456789abc"


@dataclass
class Boundary:
    url: str
    cfg: TracerlConfig
    gateway: object   # pipelines.deploy.gateway.Gateway
    vllm: str
    root: Path


@pytest.fixture(scope="session")
def boundary(tmp_path_factory, broker) -> Boundary:
    from pipelines.config.gateway import GatewayConfig
    from pipelines.deploy.service import GatewayThread, build_gateway
    from pipelines.deploy.vllm_server import start_vllm, stop_vllm
    from pipelines.models.registry import base_model_hash
    from pipelines.models.tiny import make_tiny_llama
    from pipelines.services.kafka import ensure_topic
    from pipelines.adapters.store import AdapterStore
    from tests.deploy.test_vllm import VLLM_PY, make_adapter

    if not VLLM_PY.is_file():
        pytest.skip("no .venv-vllm: run `make vllm-venv`")
    root = tmp_path_factory.mktemp("boundary")
    base = make_tiny_llama(root / "tiny", warmup_steps=20)
    vhome = root / "vllm-home"
    state = start_vllm(base, home=vhome, port=None, max_loras=4, max_lora_rank=16, max_cpu_loras=8,
                       dtype="float32", start_timeout_s=300)
    cfg = make_config(root, broker.bootstrap)
    ensure_topic(cfg)
    store, h = AdapterStore(cfg.adapter_root), base_model_hash(base)
    meta = {"parent_version": None, "base_model_hash": h, "data_window": None, "reward_spec_version": None,
            "config": {}, "metrics": {}}
    for tenant, seed in (("acme", 1), ("globex", 7)):
        store.publish(tenant, "support", make_adapter(base, root / f"src-{tenant}", seed=seed), meta)
    gcfg = GatewayConfig(api_keys=KEYS, admin_key=ADMIN, upstreams=[state.base_url], replay_interval_s=1.0)
    gw = GatewayThread(build_gateway(cfg, gcfg))
    for tenant in KEYS:
        gw.gateway.deployer.promote(tenant, "support", 1, "boundary-fixture")
    yield Boundary(url=gw.url, cfg=cfg, gateway=gw.gateway, vllm=state.base_url, root=root)
    gw.stop()
    stop_vllm(vhome)
