"""``train.device`` / ``train.precision``: resolved once against the machine, bf16 autocast on the
forwards only, fp32 logprobs; run on CPU (CPU autocast takes bf16 too), so ``make test`` checks the
mixed-precision path on every machine. The figure on a GPU: bench/train_gpu.sh."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from pipelines.config.train import TrainConfig  # noqa: E402
from pipelines.train.batch import collate, encode_turns  # noqa: E402
from pipelines.train.device import Placement, place  # noqa: E402
from pipelines.train.step import build_policy, output_logprobs, train_step  # noqa: E402
from tests.train.test_step import _cfg, _lora_state, _turns, tiny, tok  # noqa: E402,F401


def test_auto_resolves_to_the_machine_and_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert place(TrainConfig()) == Placement("cpu", "fp32")
    assert place(TrainConfig(precision="bf16")) == Placement("cpu", "bf16")
    with pytest.raises(ValueError, match="train.device='cuda' but torch sees no CUDA device"):
        place(TrainConfig(device="cuda"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert place(TrainConfig()) == Placement("cuda", "bf16")
    assert place(TrainConfig(precision="fp32")) == Placement("cuda", "fp32")
    assert place(TrainConfig(device="cpu")) == Placement("cpu", "fp32")


@pytest.mark.parametrize("bad", [{"device": "gpu"}, {"precision": "fp16"}])
def test_unknown_device_or_precision_is_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        TrainConfig.from_dict(bad)


def test_bf16_forwards_give_fp32_logprobs_close_to_fp32_and_closer_than_a_bf16_head(tiny, tok):
    model, _ = build_policy(tiny, None, _cfg(), seed=0)
    enc, _ = encode_turns(_turns(tok), tok)
    b = collate(enc, tok.pad_token_id)
    scored = b.loss_mask[:, 1:] > 0
    with torch.no_grad():
        fp32 = output_logprobs(model, b.input_ids, b.attention_mask, b.loss_mask)
        with Placement("cpu", "bf16").autocast():
            mixed = output_logprobs(model, b.input_ids, b.attention_mask, b.loss_mask)
            all_bf16 = output_logprobs(model, b.input_ids, b.attention_mask, b.loss_mask,
                                       head_only_where_scored=False)  # head in bf16 too
    assert mixed.dtype == torch.float32
    err_mixed = (mixed - fp32)[scored].abs().max()
    err_bf16 = (all_bf16.float() - fp32)[scored].abs().max()
    assert 0 < err_mixed < 0.1, err_mixed           # bf16 decoder: small, nonzero drift
    assert err_mixed < err_bf16, (err_mixed, err_bf16)  # the fp32 head removes most of it


def test_a_bf16_step_trains_fp32_lora_weights_that_move_like_the_fp32_step(tiny, tok, tmp_path):
    """On CPU here; on a GPU machine (bench/train_gpu.sh runs this file there) both steps run on CUDA."""
    turns = _turns(tok, with_behaviour=True, tiny=tiny)
    fp32 = train_step(tiny, None, turns, dataclasses.replace(_cfg(steps=2), precision="fp32"), tmp_path / "fp32", seed=3)
    bf16 = train_step(tiny, None, turns, dataclasses.replace(_cfg(steps=2), precision="bf16"), tmp_path / "bf16", seed=3)
    assert bf16.summary["bf16"] == 1.0 and fp32.summary["bf16"] == 0.0
    assert bf16.summary["device_cuda"] == float(torch.cuda.is_available())
    a, b = _lora_state(fp32.adapter_dir), _lora_state(bf16.adapter_dir)
    assert set(a) == set(b) and all(t.dtype == torch.float32 for t in b.values())  # the served format
    for k in a:
        if "lora_B" in k:   # B starts at 0: the update itself, compared in direction
            cos = torch.nn.functional.cosine_similarity(a[k].flatten(), b[k].flatten(), dim=0)
            assert cos > 0.9, (k, float(cos))
    assert abs(bf16.steps[0]["ratio_mean"] - 1.0) < 0.05  # on-policy still reads ρ ≈ 1 in bf16
