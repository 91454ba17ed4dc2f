"""``[serve]``: the embedded vLLM server's settings (the server itself: pipelines/deploy/vllm_server.py)."""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # what --max-lora-rank accepts in 0.32
DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass(config=SECTION)
class ServeConfig:
    """Settings of the embedded vLLM server (``TracerlConfig.serve``)."""

    port: int | None = None            # None = a free port on 127.0.0.1
    served_model_name: str = "base"    # the "model" clients send to get the base model
    max_loras: int = 4                 # adapters in one batch (GPU/CPU slots)
    max_lora_rank: int = 16            # largest adapter rank; one of LORA_RANKS
    max_cpu_loras: int = 8             # adapters cached in host memory (LRU), >= max_loras
    dtype: str | None = None           # None = float32 on CPU (exact logprobs), bfloat16 on GPU
    max_model_len: int = 1024          # prompt + completion tokens; bounds KV-cache use
    seed: int = 0                      # engine seed; per-request "seed" still wins
    kv_cache_gib: int = 2              # CPU only: VLLM_CPU_KVCACHE_SPACE (unset fails at start)
    cpu_threads: str | None = None     # CPU only: VLLM_CPU_OMP_THREADS_BIND, e.g. "0-1";
                                       #   None = every core this process may run on
    gpu_memory_utilization: float = 0.5  # GPU only (untested here): leave room for the learner
    start_timeout_s: float = 180.0     # until /health and /v1/models answer (CPU start ~25 s)
    python: str = ".venv-vllm/bin/python"  # relative = relative to the repository root

    def __post_init__(self) -> None:
        if self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"serve.max_lora_rank={self.max_lora_rank} is not one vLLM accepts; "
                             f"use one of {LORA_RANKS} (>= your adapters' rank r)")
        if self.max_loras < 1:
            raise ValueError(f"serve.max_loras={self.max_loras} must be >= 1")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"serve.max_cpu_loras={self.max_cpu_loras} must be >= "
                             f"serve.max_loras={self.max_loras} (vLLM refuses to start otherwise)")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"serve.dtype={self.dtype!r}: use one of {DTYPES} or None (auto by device)")
        if self.max_model_len < 16:
            raise ValueError(f"serve.max_model_len={self.max_model_len} must be >= 16 tokens")
        if self.kv_cache_gib < 1:
            raise ValueError(f"serve.kv_cache_gib={self.kv_cache_gib} must be >= 1 (GiB)")
        if not 0.05 <= self.gpu_memory_utilization <= 0.95:
            raise ValueError(f"serve.gpu_memory_utilization={self.gpu_memory_utilization} "
                             f"must be in [0.05, 0.95]")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise ValueError(f"serve.port={self.port} must be in 1..65535, or None for a free port")
