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

from pipelines.config.gate import GateConfig
from pipelines.evals.scorers import Judge, score
from pipelines.evals.suites import Suite
from pipelines.gate.reply_cache import ReplyCache


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
        return out.reply

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


@dataclass
class Samples:
    """Samples ``first .. first + count - 1`` of every item: ``scores[i][k]`` and the reply
    ``texts[i][k]`` (kept in memory for the behaviour signatures; never logged)."""

    first: int
    scores: list[list[float]]
    texts: list[list[str]]


def sample_suite(backend: Backend, name: str, suite: Suite, gate: GateConfig, judge: Judge | None = None,
                 first: int = 0, count: int | None = None, cache: ReplyCache | None = None) -> Samples:
    """Generate and score samples ``first .. first + count - 1`` (default: ``samples_per_item``)
    of each item; sample index k has the seed ``item_seed(seed, item, k)`` for every model.
    ``cache``: these weights' kept replies; a kept reply is scored, not generated again."""
    sampling = Sampling.from_gate(gate)
    count = gate.samples_per_item if count is None else count
    jobs = [(i, k) for i in range(len(suite.items)) for k in range(first, first + count)]

    def one(job: tuple[int, int]) -> tuple[float, str]:
        item = suite.items[job[0]]
        seed = item_seed(sampling.seed, item.hash, job[1])
        entry = ReplyCache.entry(item.hash, seed, sampling.temperature, sampling.top_p, sampling.max_tokens)
        text = cache.get(entry) if cache is not None else None
        if text is None:
            text = backend.generate(name, item.messages, sampling, seed)
            if cache is not None:
                cache.put(entry, text)
        return score(suite.scorer, text, item, judge), text

    with ThreadPoolExecutor(max_workers=gate.concurrency) as pool:
        results = list(pool.map(one, jobs))
    if cache is not None:
        cache.save()
    out = Samples(first, [[] for _ in suite.items], [[] for _ in suite.items])
    for (i, _), (s, text) in zip(jobs, results):
        out.scores[i].append(s)
        out.texts[i].append(text)
    return out


def evaluate_suite(backend: Backend, name: str, suite: Suite, gate: GateConfig,
                   judge: Judge | None = None) -> list[float]:
    """Per-item score (mean over ``samples_per_item``), in the suite's item order."""
    got = sample_suite(backend, name, suite, gate, judge)
    return [sum(s) / len(s) for s in got.scores]
