"""Where the learner runs and in what precision: ``train.device`` and ``train.precision`` resolved
against the machine once, so the loop reads one ``Placement``.

bf16 autocast covers the decoder forwards (where the time goes); the LM head and the
log-probability math stay fp32 (``step.output_logprobs``), since bf16 logits round a token's
logprob by up to ~0.45 against the serving engine's fp32 ones, and the importance ratio
ρ = exp(log π − log q) would then be noise. Weights, LoRA parameters and AdamW moments stay
fp32 (master weights): the adapter saved is the same format on every device.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from pipelines.config.train import TrainConfig


@dataclass(frozen=True)
class Placement:
    device: str          # "cpu" or "cuda"
    precision: str       # "fp32" or "bf16": the autocast dtype of the forwards

    @property
    def share_prefix(self) -> bool:
        """Run the rows' common prompt prefix once (``step.shared_prefix_len``): on CPU it saves the
        positions (measured on 2 cores); on an H200 in bf16 the second decoder call and the cache
        copy doubled a micro-batch's forward + backward (225 ms against 110, bench/train_forward.py),
        so on CUDA every row runs whole."""
        return self.device == "cpu"

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forwards' context: bf16 autocast, or nothing for fp32."""
        import torch

        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device, dtype=torch.bfloat16)


def place(cfg: TrainConfig) -> Placement:
    """``auto`` device: CUDA when torch sees a GPU, else CPU; ``auto`` precision: bf16 on a GPU that
    supports it, else fp32 (CPU bf16 autocast is slower than fp32 on most CPUs, so it is only used
    when asked for). Asking for CUDA without one is an error that says so."""
    import torch

    has_cuda = torch.cuda.is_available()
    device = cfg.device if cfg.device != "auto" else ("cuda" if has_cuda else "cpu")
    if device == "cuda" and not has_cuda:
        raise ValueError("train.device='cuda' but torch sees no CUDA device (torch "
                         f"{torch.__version__}, CUDA build {torch.version.cuda}); use 'auto' or 'cpu'")
    precision = cfg.precision
    if precision == "auto":
        precision = "bf16" if device == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return Placement(device, precision)
