"""A tiny Llama built offline, for tests and smoke runs of the whole loop.

Why: every stage after ingest (rollouts, learner, gate, vLLM hot swap) needs *a* causal LM
with a tokenizer and a chat template, and tests cannot download one. This builds a ~0.6M-parameter
``LlamaForCausalLM`` and a byte-level BPE tokenizer trained here on
:mod:`pipelines.models.tiny_corpus`, then (by default) warms the model up for 100
next-token steps on ChatML conversations, so it emits ``<|im_end|>`` after a reply: with random
weights every reply would run to the token limit and a length/stop reward would have no signal.

Shape choices: ``head_dim`` is exactly 64 because vLLM's CPU attention needs it (a project
requirement, not checked in this module); 2 heads x 64 = hidden 128, 2 layers,
intermediate 256, tied embeddings, fp32 safetensors (logprob ratios need fp32, see
docs/measured.md). Everything is seeded, so the same ``seed`` gives the same files on one machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.models.publish import publish
from pipelines.models.tiny_corpus import build_chat_corpus, build_corpus

BUILD_VERSION = 1  # bump when the recipe below changes, so cached folders are rebuilt

BOS, EOS, PAD, EOT = "<|im_start|>", "<|im_end|>", "<|pad|>", "<|endoftext|>"
SPECIAL_TOKENS = [EOT, BOS, EOS, PAD]  # ids 0..3, fixed order
# ChatML, as SmolLM2-Instruct uses: <|im_start|>role\ncontent<|im_end|>\n ... then the
# generation prompt. BOS = <|im_start|> and EOS = <|im_end|> mirror SmolLM2, so the learner treats
# both models alike (a reply ends at <|im_end|>). PAD is its own token so masks never hide EOS.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

MODEL_SHAPE = dict(
    hidden_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
    num_hidden_layers=2, intermediate_size=256, max_position_embeddings=1024,
    rms_norm_eps=1e-5, tie_word_embeddings=True,
)


def build_tokenizer(vocab_size: int = 2048):
    """Train a byte-level BPE tokenizer on the built-in corpus; return a PreTrainedTokenizerFast.

    Byte-level: any UTF-8 input round-trips (no unknown token), like GPT-2/SmolLM2.
    The special tokens are removed from the training text so no merges are spent on them.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = [_strip_specials(line) for line in build_corpus(n_lines=8000)]  # ~0.8 MB, 0.2 s
    tok.train_from_iterator(text, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=MODEL_SHAPE["max_position_embeddings"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer_portable(tokenizer, folder: Path) -> None:
    """``save_pretrained`` plus a ``tokenizer_config.json`` that transformers 4.x also reads.

    transformers 5 writes ``tokenizer_class: TokenizersBackend``, a class 4.x lacks; vLLM may
    run with its own transformers, so name the class both versions know (in 5.x
    ``PreTrainedTokenizerFast`` is the same class).
    """
    import json

    tokenizer.save_pretrained(folder)
    path = Path(folder) / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _strip_specials(line: str) -> str:
    for s in SPECIAL_TOKENS:
        line = line.replace(s, "\n")
    return line


def _build_model(tokenizer, seed: int):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        dtype="float32", **MODEL_SHAPE)
    # fork_rng: seed the init without changing the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id)
    return model


def _warm_up(model, tokenizer, steps: int, seed: int, seq_len: int = 128, batch: int = 8,
             lr: float = 3e-3) -> float:
    """Next-token training on packed ChatML conversations; returns the final loss.

    Why packing: every position is a real token, so ~100 steps (8 x 128 tokens, ~6 s on 2
    cores, loss ~1.4) already teach the turn layout and the stop token. Batches come from a
    seeded generator: same seed, same weights.
    """
    import torch

    ids: list[int] = []
    for doc in build_chat_corpus():
        ids += tokenizer(doc, add_special_tokens=False)["input_ids"]
    data = torch.tensor(ids, dtype=torch.long)
    n_windows = (len(data) - 1) // seq_len
    windows = data[: n_windows * seq_len + 1]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        # cosine decay to 10% keeps the last steps from bouncing the loss around
        frac = step / max(1, steps - 1)
        for g in opt.param_groups:
            g["lr"] = lr * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(frac * torch.pi)).item()))
        starts = torch.randint(0, n_windows, (batch,), generator=gen) * seq_len
        x = torch.stack([windows[s: s + seq_len] for s in starts.tolist()])
        y = torch.stack([windows[s + 1: s + seq_len + 1] for s in starts.tolist()])
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return float(loss.item())


def make_tiny_llama(out_dir: Path, seed: int = 0, warmup_steps: int = 100, vocab_size: int = 2048) -> Path:
    """Build (or reuse) the tiny Llama folder at ``out_dir`` and return its path.

    Cached: a folder with a ``READY`` marker recording the same (seed, warmup_steps,
    vocab_size, version) is returned as is. Atomic: built in a temp folder, then renamed.
    ``warmup_steps=0`` gives the raw random init (fastest; replies rarely stop).
    The folder loads with ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``.
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps} must be >= 0 (0 = random init, no warm-up)")
    if not 300 <= vocab_size <= 65536:
        raise ValueError(f"vocab_size={vocab_size} must be in [300, 65536]: 256 bytes + specials + merges")
    params = {"recipe": "tiny-llama", "version": BUILD_VERSION, "seed": seed,
              "warmup_steps": warmup_steps, "vocab_size": vocab_size}

    def build(tmp: Path) -> dict[str, Any]:
        import torch

        tokenizer = build_tokenizer(vocab_size)
        model = _build_model(tokenizer, seed)
        final_loss = _warm_up(model, tokenizer, warmup_steps, seed) if warmup_steps else None
        model.save_pretrained(tmp, safe_serialization=True)
        save_tokenizer_portable(tokenizer, tmp)
        n_params = sum(p.numel() for p in model.parameters())
        return {"n_params": n_params, "warmup_final_loss": final_loss,
                "torch": torch.__version__}

    return publish(Path(out_dir), params, build)
