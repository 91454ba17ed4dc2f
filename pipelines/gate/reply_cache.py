"""The champion's eval replies, kept from the gate that judged it a candidate.

Every gate asks the champion the same items with the same sampling and per-(item, sample)
seeds it was asked as a candidate, so its replies are already known: each gate then
generates for one arm only. Replies, not scores, are kept: scorers and suites can change
between gates and are re-run on the kept text (cheap; an ``llm_judge`` is asked again).

The key is what decides a reply: the weights (the base model's hash and the adapter's files,
so a republished or edited adapter misses), the sampling settings, the item's prompt hash and
the seed. Not in the key: the serving engine (vLLM version, its flags) and the eval prompt's
rendering inside it; after an engine upgrade, clear ``<home>/gate_replies`` (or set
``gate.reuse_replies = false``). vLLM on CPU is not batch-invariant, so a regenerated reply with
the same seed can differ in a token; either is a sample of the champion with that seed, and the
paired test pairs by seed.

The files hold replies to private eval items: they stay in the home, one folder per target
(``<home>/gate_replies/<tenant>/<task>``, so one tenant's gate never reads another's), and are
never logged to MLflow.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def weights_key(base_hash: str, adapter_dir: Path | None) -> str:
    """sha256 over the base model's hash and the adapter's config and weights (None: the base)."""
    h = hashlib.sha256(base_hash.encode())
    for name in ADAPTER_FILES if adapter_dir is not None else ():
        h.update(b"\0" + name.encode() + b"\0")
        with open(Path(adapter_dir) / name, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


class ReplyCache:
    """The replies of one set of weights, in ``<folder>/<weights key>.json``; ``save`` writes the
    file atomically (last writer wins: a lost entry is regenerated, never wrong)."""

    def __init__(self, folder: Path, key: str):
        self.path = Path(folder) / f"{key}.json"
        self._lock = threading.Lock()
        self._new = 0
        try:
            kept = json.loads(self.path.read_text())
        except (OSError, ValueError):
            kept = None
        # none yet, or a foreign file: start over
        self._replies: dict[str, str] = {k: v for k, v in kept.items() if isinstance(v, str)} \
            if isinstance(kept, dict) else {}
        self.hits = 0

    @staticmethod
    def entry(item_hash: str, seed: int, temperature: float, top_p: float, max_tokens: int) -> str:
        return f"{item_hash}|{seed}|{temperature!r}|{top_p!r}|{max_tokens}"

    def get(self, entry: str) -> str | None:
        with self._lock:
            text = self._replies.get(entry)
            self.hits += text is not None
            return text

    def put(self, entry: str, text: str) -> None:
        with self._lock:
            self._replies[entry] = text
            self._new += 1

    def save(self) -> None:
        with self._lock:
            if not self._new:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as fh:
                json.dump(self._replies, fh)
            os.replace(tmp, self.path)
            self._new = 0
