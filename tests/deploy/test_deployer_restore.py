"""Restore validates like deploy: an adapter changed on disk since its deploy (torn weights, a
base hash that no longer matches) is refused at restart with its reason, and the other routes
restore into a real vLLM (tiny model, CPU). Ids are full matches (no trailing newline)."""

from __future__ import annotations

import json

import pytest

from pipelines.deploy import admin
from pipelines.deploy.deployer import Deployer, DeployError, read_swaps, validate_adapter
from pipelines.deploy.routing import Router
from pipelines.models.registry import base_model_hash
from pipelines.adapters.store import META, AdapterStore, check_id
from tests.deploy.test_vllm import VLLM_PY, make_adapter

META_OK = {"parent_version": None, "data_window": None, "reward_spec_version": None, "config": {}, "metrics": {}}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """A store with four published adapters, all valid when published, on the tiny base."""
    from pipelines.models.tiny import make_tiny_llama

    root = tmp_path_factory.mktemp("restore")
    base = make_tiny_llama(root / "tiny", warmup_steps=20)
    store, h = AdapterStore(root / "adapters"), base_model_hash(base)
    src = make_adapter(base, root / "src", seed=1)
    for tenant, task in (("acme", "support"), ("globex", "support"), ("acme", "sql"), ("acme", "code")):
        store.publish(tenant, task, src, {**META_OK, "base_model_hash": h})
    return dict(root=root, base=base, store=store, hash=h)


def tamper(store: AdapterStore) -> None:
    """acme/sql: weights torn mid-file; acme/code: its record now names another base."""
    weights = store.get("acme", "sql", 1).path / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    meta = store.get("acme", "code", 1).path / META
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "base_model_hash": "f" * 64}))


@pytest.mark.parametrize("bad", ["acme\n", "acme\r\n", "\nacme", "acme/x", "acme ", "ac\x00me", "ａcme"])
def test_check_id_full_matches(bad):
    with pytest.raises(ValueError, match="safe id"):
        check_id(bad, "tenant")


def test_a_version_folder_with_a_trailing_newline_is_not_a_version(tmp_path):
    store = AdapterStore(tmp_path)
    folder = tmp_path / "acme" / "support" / "v1\n"
    folder.mkdir(parents=True)
    (folder / "READY").write_text("{}")
    assert store.list("acme", "support") == [] and store.next_version("acme", "support") == 1


def test_validation_refuses_torn_weights_and_a_changed_base_hash(adapters, tmp_path):
    store, h = AdapterStore(tmp_path / "adapters"), adapters["hash"]
    path = store.publish("acme", "sql", adapters["root"] / "src", {**META_OK, "base_model_hash": h}).path
    weights = path / "adapter_model.safetensors"
    good = weights.read_bytes()
    validate_adapter(store, "acme", "sql", 1, h)
    for torn in (good[:-100], good[:8], b"", b"\xff" * 64, good + b"x"):
        weights.write_bytes(torn)
        with pytest.raises(DeployError, match="not a valid safetensors file"):
            validate_adapter(store, "acme", "sql", 1, h)
    weights.write_bytes(good)
    with pytest.raises(DeployError, match="trained on base model"):
        validate_adapter(store, "acme", "sql", 1, "0" * 64)


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PY.is_file(), reason="no .venv-vllm: run `make vllm-venv`")
def test_restore_refuses_tampered_adapters_and_restores_the_others(adapters):
    from pipelines.deploy.vllm_server import start_vllm, stop_vllm

    root, store, h = adapters["root"], adapters["store"], adapters["hash"]
    router = Router(root / "deploy" / "routes.json")
    for tenant, task in (("acme", "support"), ("globex", "support"), ("acme", "sql"), ("acme", "code")):
        router.flip(tenant, task, 1, str(store.get(tenant, task, 1).path))       # deployed while valid
    tamper(store)
    home = root / "vllm-home"
    state = start_vllm(adapters["base"], home=home, port=None, max_loras=4, max_lora_rank=16, max_cpu_loras=8,
                       dtype="float32", start_timeout_s=240)
    try:
        swaps = root / "deploy" / "swaps.jsonl"
        deployer = Deployer(Router(root / "deploy" / "routes.json"), [state.base_url], store, h, swaps)
        records = {f"{r['tenant']}/{r['task']}": r for r in deployer.restore()}
        assert {k: r["ok"] for k, r in records.items()} == {
            "acme/support": True, "globex/support": True, "acme/sql": False, "acme/code": False}
        assert "not a valid safetensors file" in records["acme/sql"]["error"]
        assert "trained on base model" in records["acme/code"]["error"]
        loaded = {m["id"] for m in admin.list_models(state.base_url)}
        assert {"acme/support/v1", "globex/support/v1"} <= loaded
        assert not {"acme/sql/v1", "acme/code/v1"} & loaded
        assert [r["action"] for r in read_swaps(swaps)] == ["restore"] * 4
        again = deployer.restore()                                       # already loaded: still ok
        assert sorted(r["ok"] for r in again) == [False, False, True, True]
    finally:
        stop_vllm(home)
