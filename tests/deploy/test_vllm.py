"""Live vLLM (CPU, fp32) with runtime LoRA: completions with token ids and logprobs, adapter
load / in-place swap / unload, clear errors, and logprobs equal to transformers+peft.

One server for the module (~30 s to start on 2 cores). The server tests skip only when
``.venv-vllm/bin/python`` is missing (``make vllm-venv`` creates it); config and command-line
tests run everywhere.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipelines.deploy import admin
from pipelines.deploy.vllm_server import (
    REPO, ServeConfig, VllmError, build_command, build_env, read_state, start_vllm,
    stop_vllm)
from pipelines.services.process import group_members

VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
needs_vllm = pytest.mark.skipif(
    not VLLM_PY.is_file(),
    reason=f"no {VLLM_PY.relative_to(REPO)}: run `make vllm-venv` to test against a live vLLM")
LOGPROB_TOL = 1e-3  # fp32 on both sides; docs/measured.md measured 4e-5
PROMPTS = ["What is the weather in Oslo?", "Call get_weather for Paris, please.", "Say hello."]


# -- no server needed -------------------------------------------------------------------------

@pytest.mark.parametrize("field,value,words", [
    ("max_lora_rank", 12, "max_lora_rank=12"),
    ("max_loras", 0, "max_loras=0"),
    ("max_cpu_loras", 2, "max_cpu_loras=2"),   # < max_loras=4
    ("dtype", "fp32", "dtype='fp32'"),
    ("max_model_len", 8, "max_model_len=8"),
    ("kv_cache_gib", 0, "kv_cache_gib=0"),
    ("gpu_memory_utilization", 1.0, "gpu_memory_utilization=1.0"),
    ("port", 70000, "port=70000"),
])
def test_serve_config_rejects_bad_values_and_quotes_them(field, value, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        ServeConfig(**{field: value})


def test_command_binds_loopback_and_branches_on_device(tmp_path):
    cfg = ServeConfig(max_loras=2, max_lora_rank=8, max_cpu_loras=3)
    cpu = build_command(Path("/py"), tmp_path, cfg, 8123, gpu=False)
    flag = lambda argv, name: argv[argv.index(name) + 1]  # noqa: E731
    assert flag(cpu, "--host") == "127.0.0.1" and flag(cpu, "--port") == "8123"
    assert flag(cpu, "--dtype") == "float32" and "--enable-lora" in cpu
    assert [flag(cpu, f) for f in ("--max-loras", "--max-lora-rank", "--max-cpu-loras")] == ["2", "8", "3"]
    assert flag(cpu, "--logprobs-mode") == "raw_logprobs" and "--gpu-memory-utilization" not in cpu
    gpu = build_command(Path("/py"), tmp_path, cfg, 8123, gpu=True)
    assert flag(gpu, "--dtype") == "bfloat16" and "--gpu-memory-utilization" in gpu
    env = build_env(cfg, gpu=False)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_OMP_THREADS_BIND"]  # every core we may use, e.g. "0,1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in build_env(cfg, gpu=True)


@needs_vllm
@pytest.mark.slow
def test_failed_start_is_a_clear_error_with_the_log_tail(tmp_path):
    """A folder vLLM cannot serve (no tokenizer): it exits in ~10 s, we say so, quote the log,
    leave no state file and no process behind."""
    bad = tmp_path / "no-tokenizer"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "llama"}')
    home = tmp_path / "home"
    with pytest.raises(VllmError, match=r"exited with code \d+ \(log .*vllm\.log\)(.|\n)*tokenizer"):
        start_vllm(bad, home=home, start_timeout_s=120)
    assert read_state(home) is None and not (home / "run" / "vllm.json").exists()


# -- one live server --------------------------------------------------------------------------

def make_adapter(base: Path, out: Path, r: int = 8, seed: int = 0, scale: float = 0.1) -> Path:
    """A PEFT LoRA on q/k/v/o with random B (PEFT's init has B=0, a no-op), saved as safetensors."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    peft_model = get_peft_model(model, lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    peft_model.save_pretrained(out, safe_serialization=True)
    return out


_hf_cache: dict[tuple, object] = {}


def hf_logprobs(base: Path, adapter: Path | None, prompt_ids: list[int], ids: list[int]) -> list[float]:
    """Teacher-forced fp32 log p(ids[i] | prompt, ids[:i]) from transformers (+ peft)."""
    import torch
    from transformers import AutoModelForCausalLM

    key = (str(base), str(adapter))
    if key not in _hf_cache:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter)
        _hf_cache[key] = model.eval()
    model = _hf_cache[key]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    pos = torch.arange(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(ids))
    return logp[pos, torch.tensor(ids)].tolist()


@dataclasses.dataclass
class Served:
    base: Path
    home: Path
    url: str
    adapters: Path
    v1: Path
    v2: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from pipelines.models.tiny import make_tiny_llama

    root = tmp_path_factory.mktemp("vllm")
    base = make_tiny_llama(root / "tiny", warmup_steps=20)
    adapters = root / "adapters"
    v1 = make_adapter(base, adapters / "pol-v1", seed=1)
    v2 = make_adapter(base, adapters / "pol-v2", seed=2)
    home = root / "home"
    state = start_vllm(base, home=home, port=None, max_loras=4, max_lora_rank=16, max_cpu_loras=8,
                       dtype="float32", python=".venv-vllm/bin/python", start_timeout_s=240)
    print(f"\nvLLM pid {state.pid} healthy on {state.base_url} after {state.start_seconds}s")
    yield Served(base, home, state.base_url, adapters, v1, v2)
    stop_vllm(home)


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def max_abs_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


@needs_vllm
@pytest.mark.slow
def test_second_start_reuses_the_running_server(served):
    first = read_state(served.home)
    again = start_vllm(served.base, home=served.home)
    assert first is not None and again.pid == first.pid and again.port == first.port
    assert [m["id"] for m in admin.list_models(served.url)] == ["base"]


@needs_vllm
@pytest.mark.slow
def test_base_completion_returns_token_ids_and_logprobs(served):
    from transformers import AutoTokenizer

    out = admin.complete(served.url, "base", "The weather in Oslo is", max_tokens=12, seed=0)
    assert out.token_ids and len(out.logprobs) == len(out.token_ids) and out.prompt_token_ids
    assert all(lp <= 0.0 for lp in out.logprobs) and out.model == "base"
    # chat: the server renders the same ChatML template, to the same ids, as transformers
    tok = AutoTokenizer.from_pretrained(served.base)
    out = admin.complete(served.url, "base", messages=chat(PROMPTS[0]), max_tokens=12, seed=0)
    text = tok.apply_chat_template(chat(PROMPTS[0]), add_generation_prompt=True, tokenize=False)
    assert out.prompt_token_ids == tok(text, add_special_tokens=False)["input_ids"]
    assert len(out.logprobs) == len(out.token_ids) > 0 and out.finish_reason in ("stop", "length")


@needs_vllm
@pytest.mark.slow
def test_seeded_requests_too_long_to_prefill_together_do_not_kill_the_engine(served):
    """Seeded requests whose prompts together exceed one step's token budget: on CPU, vLLM 0.32
    chunks such a prefill and then rewinds the request's generator offset, which a CPU generator
    does not have ("CPU Generator does not use offset"); the engine died and every request after
    it got a 500 (seen with the tools family's long tool-block prompts). The server is started
    without chunked prefill on CPU, so every one of these is answered and it stays healthy."""
    from concurrent.futures import ThreadPoolExecutor

    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(served.base)(" ".join(f"city{i} weather" for i in range(400)))["input_ids"]
    long = AutoTokenizer.from_pretrained(served.base).decode(ids[:600])  # 12 x ~600 tokens: no one step holds them

    def one(i: int) -> str:
        return admin.complete(served.url, "base", messages=chat(f"{i}: {long}"), max_tokens=4, seed=i,
                              logprobs=True).finish_reason or ""

    with ThreadPoolExecutor(12) as pool:
        finished = list(pool.map(one, range(12)))
    assert len(finished) == 12 and all(f in ("stop", "length") for f in finished)
    assert admin.complete(served.url, "base", messages=chat(PROMPTS[0]), max_tokens=4, seed=1).token_ids


@needs_vllm
@pytest.mark.slow
def test_a_final_assistant_message_is_continued_and_the_reply_starts_with_it(served):
    """A forced call's opening (the gateway's prefix) is continued, not answered: the prompt ends
    inside the assistant turn, as transformers renders it with continue_final_message, and the
    reply an app or an eval scorer reads is that opening plus what was sampled; HFPolicy (where no
    vLLM runs) templates it the same way."""
    from transformers import AutoTokenizer

    from pipelines.contract.tool_calls import call_prefix
    from pipelines.sim.policy import HFPolicy

    opened = [*chat(PROMPTS[1]), {"role": "assistant", "content": call_prefix("required")}]
    out = admin.complete(served.url, "base", messages=opened, max_tokens=8, seed=0, logprobs=False)
    tok = AutoTokenizer.from_pretrained(served.base)
    text = tok.apply_chat_template(opened, continue_final_message=True, add_generation_prompt=False, tokenize=False)
    assert text.endswith(call_prefix("required"))
    assert out.prompt_token_ids == tok(text, add_special_tokens=False)["input_ids"]
    assert out.prefix == call_prefix("required") and out.reply == out.prefix + out.text
    assert HFPolicy(served.base).prompt_ids(opened) == out.prompt_token_ids
    plain = admin.complete(served.url, "base", messages=chat(PROMPTS[1]), max_tokens=8, seed=0, logprobs=False)
    assert plain.prefix == "" and plain.reply == plain.text


@needs_vllm
@pytest.mark.slow
def test_loaded_adapter_is_served_by_name_and_changes_outputs(served):
    assert "Success" in admin.load_adapter(served.url, "pol", served.v1)
    models = {m["id"]: m for m in admin.list_models(served.url)}
    assert models["pol"]["root"] == str(served.v1) and models["pol"]["parent"] == "base"
    for prompt in PROMPTS:
        base = admin.complete(served.url, "base", messages=chat(prompt), max_tokens=16, seed=3)
        pol = admin.complete(served.url, "pol", messages=chat(prompt), max_tokens=16, seed=3)
        assert pol.model == "pol" and pol.prompt_token_ids == base.prompt_token_ids
        n = min(len(base.token_ids), len(pol.token_ids))
        same_tokens = base.token_ids == pol.token_ids
        assert not same_tokens or max_abs_diff(base.logprobs[:n], pol.logprobs[:n]) > 1e-2


@needs_vllm
@pytest.mark.slow
def test_logprobs_equal_transformers_peft_teacher_forced(served):
    """Sampled at temperature 1, top_p 1, top_k off: vLLM's logprobs are the sampling
    distribution's, and equal the fp32 transformers(+peft) forward on the same ids."""
    if "pol" not in {m["id"] for m in admin.list_models(served.url)}:
        admin.load_adapter(served.url, "pol", served.v1)
    worst = {}
    for name, adapter in (("base", None), ("pol", served.v1)):
        diffs = []
        for i, prompt in enumerate(PROMPTS):
            out = admin.complete(served.url, name, messages=chat(prompt), max_tokens=32,
                                 temperature=1.0, top_p=1.0, top_k=-1, seed=10 + i)
            ref = hf_logprobs(served.base, adapter, out.prompt_token_ids, out.token_ids)
            diffs.append(max_abs_diff(out.logprobs, ref))
        worst[name] = max(diffs)
    print(f"\nmax |logprob vLLM - transformers|: {worst}")
    assert max(worst.values()) < LOGPROB_TOL, worst


@needs_vllm
@pytest.mark.slow
def test_logprobs_are_raw_even_when_sampling_is_tempered(served):
    """Default logprobs mode is raw: at temperature 0.5 / top_k 20 the reported numbers are
    still the untempered model's, so importance ratios must use temperature 1 rollouts."""
    out = admin.complete(served.url, "base", messages=chat(PROMPTS[1]), max_tokens=24,
                         temperature=0.5, top_k=20, seed=7)
    ref = hf_logprobs(served.base, None, out.prompt_token_ids, out.token_ids)
    assert max_abs_diff(out.logprobs, ref) < LOGPROB_TOL


@needs_vllm
@pytest.mark.slow
def test_load_inplace_swaps_to_the_new_weights(served):
    admin.load_adapter(served.url, "swap", served.v1)
    with pytest.raises(admin.VllmAdminError, match="already been loaded") as err:
        admin.load_adapter(served.url, "swap", served.v2)  # same name, no load_inplace
    assert err.value.status == 400
    admin.load_adapter(served.url, "swap", served.v2, load_inplace=True)  # new path per version
    assert {m["id"]: m["root"] for m in admin.list_models(served.url)}["swap"] == str(served.v2)
    out = admin.complete(served.url, "swap", messages=chat(PROMPTS[2]), max_tokens=24, seed=5)
    ref_v2 = hf_logprobs(served.base, served.v2, out.prompt_token_ids, out.token_ids)
    ref_v1 = hf_logprobs(served.base, served.v1, out.prompt_token_ids, out.token_ids)
    assert max_abs_diff(out.logprobs, ref_v2) < LOGPROB_TOL < max_abs_diff(out.logprobs, ref_v1)
    admin.unload_adapter(served.url, "swap")


@needs_vllm
@pytest.mark.slow
def test_unload_removes_the_adapter_from_models(served):
    admin.load_adapter(served.url, "gone", served.v1)
    assert "gone" in {m["id"] for m in admin.list_models(served.url)}
    assert "Success" in admin.unload_adapter(served.url, "gone")
    assert "gone" not in {m["id"] for m in admin.list_models(served.url)}
    with pytest.raises(admin.VllmAdminError, match="cannot be found") as err:
        admin.unload_adapter(served.url, "gone")
    assert err.value.status == 404
    with pytest.raises(admin.VllmAdminError, match="does not exist") as err:
        admin.complete(served.url, "gone", "hello", max_tokens=4)
    assert err.value.status == 404


@needs_vllm
@pytest.mark.slow
def test_bad_adapters_are_clear_errors_and_the_base_keeps_serving(served):
    too_big = make_adapter(served.base, served.adapters / "rank32", r=32)
    cases = [(served.adapters / "missing", 404, "No adapter found"),
             (served.base, 404, "No adapter found"),          # a model folder, not an adapter
             (too_big, 500, "greater than max_lora_rank")]     # r=32 > --max-lora-rank 16
    for path, status, words in cases:
        with pytest.raises(admin.VllmAdminError, match=words) as err:
            admin.load_adapter(served.url, "bad", path)
        assert err.value.status == status, err.value
        out = admin.complete(served.url, "base", "Hello", max_tokens=4, seed=0)
        assert out.token_ids
    assert "bad" not in {m["id"] for m in admin.list_models(served.url)}


@needs_vllm
@pytest.mark.slow
def test_stop_ends_our_process_group_only(served):
    state = read_state(served.home)
    assert state is not None and group_members(state.pid)
    assert stop_vllm(served.home) is True
    assert not group_members(state.pid) and read_state(served.home) is None
    assert stop_vllm(served.home) is False
    with pytest.raises(admin.VllmAdminError) as err:
        admin.list_models(served.url)
    assert err.value.status is None  # unreachable
