"""The canary demo's deliberately bad candidate (pipelines/loop/backwards.py): a share of an
adapter's update taken back (or reversed), published and registered like any candidate."""

from __future__ import annotations

import json

import pytest

from pipelines.config import TracerlConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from pipelines.models.tiny import make_tiny_llama
    from tests.deploy.test_vllm import make_adapter

    root = tmp_path_factory.mktemp("backwards")
    base = make_tiny_llama(root / "tiny", warmup_steps=0)
    return base, make_adapter(base, root / "good", seed=3)


def merged_delta(base, adapter) -> dict:
    """Per weight matrix: (base + the adapter's update) - base, as PEFT merges it."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).state_dict()
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                       adapter).merge_and_unload().state_dict()
    return {k: merged[k] - plain[k] for k in plain if not torch.equal(merged[k], plain[k])}


@pytest.mark.parametrize("take_back", [2.0, 1.4, 0.3])
def test_the_adapter_serves_its_update_with_the_share_taken_back(tiny, tmp_path, take_back):
    import torch

    from pipelines.loop.backwards import reverse_update

    base, good = tiny
    n = reverse_update(good, tmp_path / "bad", take_back)
    assert n == 4 * 2  # q, k, v, o in each of the tiny model's layers
    up, down = merged_delta(base, good), merged_delta(base, tmp_path / "bad")
    assert up and set(up) == set(down)
    for k in up:
        assert torch.allclose(down[k], (1 - take_back) * up[k], atol=1e-6), k
    assert json.loads((tmp_path / "bad" / "adapter_config.json").read_text()) == \
        json.loads((good / "adapter_config.json").read_text())


def test_a_folder_without_lora_b_is_refused(tiny, tmp_path):
    import torch
    from safetensors.torch import save_file

    from pipelines.loop.backwards import reverse_update

    src = tmp_path / "not-lora"
    src.mkdir()
    save_file({"w": torch.ones(2)}, str(src / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="no lora_B tensors"):
        reverse_update(src, tmp_path / "out")
    for k in (0, 1, -0.5):
        with pytest.raises(ValueError, match=f"take_back={k}: must be > 0 and not 1"):
            reverse_update(src, tmp_path / f"out{k}", k)


def test_published_with_its_lineage_and_registered_as_deliberately_bad(tiny, tmp_path, monkeypatch):
    from pipelines.adapters import registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.loop.backwards import publish_backwards
    from pipelines.tracking import client

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _, good = tiny
    cfg = TracerlConfig(home=tmp_path / "home")
    store = AdapterStore(cfg.adapter_root)
    store.publish("acme", "concise", good, {"parent_version": None, "base_model_hash": "h", "data_window": None,
                                            "reward_spec_version": "s1", "config": {"lr": 1}, "metrics": {"kl": 0.1}})
    assert publish_backwards(cfg, "acme", "concise", 1, take_back=0.5) == 2
    bad = store.get("acme", "concise", 2)
    assert bad.meta["config"]["take_back"] == 0.5 and "0.5 of its update taken back" in bad.meta["config"]["deliberately_bad"]
    assert bad.meta["parent_version"] == 1 and bad.meta["base_model_hash"] == "h"
    assert bad.meta["config"]["deliberately_bad"].startswith("deliberately bad") and bad.meta["metrics"] == {}
    assert [v.version for v in store.lineage("acme", "concise", 2)] == [2, 1]
    mv = registry.version_for_adapter(cfg, "acme", "concise", 2)
    assert mv.tags["tracerl.deliberately_bad"] == "true" and mv.tags["parent_version"] == "1"
    artifacts = {a.path for a in client(cfg).list_artifacts(mv.run_id, "adapter")}
    assert "adapter/adapter_model.safetensors" in artifacts
    with pytest.raises(KeyError):
        publish_backwards(cfg, "acme", "concise", 9)  # no such version: nothing published
    assert store.latest("acme", "concise").version == 2


def _summary(outcome: str, delta: float, low: float, high: float) -> dict:
    return {"outcome": outcome, "reasons": ["r"], "suites": {
        "guard": {"role": "guard", "delta": -0.5, "low": -0.9, "high": -0.1},
        "concise": {"role": "primary", "delta": delta, "low": low, "high": high}}}


def test_nearly_passing_means_the_gate_could_not_call_it_worse_on_the_primary_suite():
    from assets.canary_demo import CanaryDemoConfig, nearly_passes

    assert nearly_passes(_summary("reject", -0.06, -0.19, 0.03))       # interval holds 0: cannot call it worse
    assert not nearly_passes(_summary("reject", -0.15, -0.27, -0.02))   # significantly worse
    assert nearly_passes(_summary("promote", 0.2, 0.05, 0.3))
    assert not nearly_passes({"outcome": "contaminated", "reasons": ["x"]})
    with pytest.raises(ValueError, match="not 1"):
        CanaryDemoConfig(take_back=(0.5, 1.0))
    with pytest.raises(ValueError, match="one or more"):
        CanaryDemoConfig(take_back=())


def test_the_cli_reads_the_shares_and_refuses_bad_ones(capsys):
    import argparse

    from tracerl.cli import _shares

    assert _shares("0.75,0.5, 0.3") == (0.75, 0.5, 0.3)
    for bad in ("", "0.5,1", "a,b", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            _shares(bad)
