"""Run a suite's items through a served model and score them.

Candidate and champion get identical requests: same items in the same order, same sampling
(temperature, top_p, max_tokens) and the same per-(item, sample) seed, served side by side by
one vLLM (both adapters loaded), so differences come from the weights alone. Outputs stay in
memory: only scores leave this module.
"""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipelines.gate.config import GateConfig
from pipelines.gate.scorers import Judge, score
from pipelines.gate.suites import Suite


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    max_tokens: int
    seed: int

    @classmethod
    def from_gate(cls, g: GateConfig) -> "Sampling":
        return cls(g.temperature, g.top_p, g.max_tokens, g.seed)


class Backend(Protocol):
    def prepare(self, name: str, adapter_path: Path | None) -> None:
        """Make ``name`` servable (load the adapter; None = the base model)."""

    def generate(self, name: str, messages: list[dict[str, Any]], sampling: Sampling, seed: int) -> str: ...

    def release(self, name: str) -> None: ...


class VllmBackend:
    """vLLM with runtime LoRA: adapters loaded under gate-only names, unloaded afterwards."""

    def __init__(self, base_url: str, base_name: str = "base"):
        self.base_url, self.base_name = base_url, base_name
        self._loaded: set[str] = set()

    def prepare(self, name: str, adapter_path: Path | None) -> None:
        from pipelines.deploy import admin

        if adapter_path is None:
            return
        try:
            admin.load_adapter(self.base_url, name, adapter_path)
        except admin.VllmAdminError as err:
            if not (err.status == 400 and "already" in err.message):
                raise
        self._loaded.add(name)

    def generate(self, name: str, messages: list[dict[str, Any]], sampling: Sampling, seed: int) -> str:
        from pipelines.deploy import admin

        out = admin.complete(self.base_url, name, messages=messages, max_tokens=sampling.max_tokens,
                             temperature=sampling.temperature, top_p=sampling.top_p, seed=seed,
                             logprobs=False, return_token_ids=False)
        return out.text

    def release(self, name: str) -> None:
        from pipelines.deploy import admin

        if name in self._loaded:
            try:
                admin.unload_adapter(self.base_url, name)
            except admin.VllmAdminError:
                pass  # already gone; unload only hides the name anyway
            self._loaded.discard(name)


def item_seed(base_seed: int, item_hash: str, sample: int) -> int:
    """Deterministic per (item, sample), independent of item order and of the model."""
    return (base_seed * 1_000_003 + zlib.crc32(item_hash.encode()) + sample * 7919) % (2 ** 31)


def evaluate_suite(backend: Backend, name: str, suite: Suite, gate: GateConfig,
                   judge: Judge | None = None) -> list[float]:
    """Per-item score (mean over ``samples_per_item``), in the suite's item order."""
    sampling = Sampling.from_gate(gate)
    jobs = [(i, k) for i in range(len(suite.items)) for k in range(gate.samples_per_item)]

    def one(job: tuple[int, int]) -> float:
        item = suite.items[job[0]]
        text = backend.generate(name, item.messages, sampling, item_seed(sampling.seed, item.hash, job[1]))
        return score(suite.scorer, text, item, judge)

    with ThreadPoolExecutor(max_workers=gate.concurrency) as pool:
        scores = list(pool.map(one, jobs))
    per_item = [0.0] * len(suite.items)
    for (i, _), s in zip(jobs, scores):
        per_item[i] += s / gate.samples_per_item
    return per_item
