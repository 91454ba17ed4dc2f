"""The served rate on held-out prompts: the share of replies a family's users would like.

The learning curves of `bench/learn.py` are read off this number, measured on the model as
vLLM serves it (the champion's adapter, loaded under a measurement-only name), on prompts the
learner never trains on (the task's private eval topics), with the traffic's own sampling
(T=1, top_p 1). Requests go to vLLM directly, not through the gateway, so measuring records
no traffic. Tools are rendered into the prompt exactly as the gateway renders them.

The standard error is clustered by prompt: samples of one prompt are correlated, so the
plain binomial error over all samples would overstate the precision.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Rate:
    """Liked share over `n` replies to `prompts` held-out prompts, with its clustered standard error."""

    liked: int
    n: int
    prompts: int
    se: float

    @property
    def rate(self) -> float:
        return self.liked / self.n if self.n else math.nan

    def __str__(self) -> str:
        return f"{self.rate:.3f} ± {self.se:.3f} ({self.liked}/{self.n})"


def clustered_rate(per_prompt: list[list[bool]]) -> Rate:
    """Rate and standard error of the mean of per-prompt means (equal samples per prompt)."""
    means = [sum(g) / len(g) for g in per_prompt if g]
    k = len(means)
    liked, n = sum(sum(g) for g in per_prompt), sum(len(g) for g in per_prompt)
    if k < 2:
        return Rate(liked, n, k, math.nan)
    mu = sum(means) / k
    sd = math.sqrt(sum((m - mu) ** 2 for m in means) / (k - 1))
    return Rate(liked, n, k, sd / math.sqrt(k))


def served_rate(base_url: str, model: str, family: Any, *, samples: int = 4, max_tokens: int = 48,
                seed: int = 0, concurrency: int = 16) -> Rate:
    """Sample `samples` replies per held-out prompt of `family` from `model` (a name vLLM serves)."""
    from pipelines.deploy import admin
    from pipelines.sim.families import Reply, model_input

    prompts = [model_input(family, m) for m in family.prompts("heldout")]
    jobs = [(i, k) for i in range(len(prompts)) for k in range(samples)]

    def one(job: tuple[int, int]) -> bool:
        i, k = job
        s = (seed * 1_000_003 + zlib.crc32(repr(prompts[i]).encode()) + k * 7919) % (2 ** 31)
        out = admin.complete(base_url, model, messages=prompts[i], max_tokens=max_tokens, temperature=1.0,
                             top_p=1.0, seed=s, logprobs=False, return_token_ids=True)
        return bool(family.liked(Reply(out.reply, len(out.token_ids), out.finish_reason)))

    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, jobs))
    per_prompt: list[list[bool]] = [[] for _ in prompts]
    for (i, _), ok in zip(jobs, results):
        per_prompt[i].append(ok)
    return clustered_rate(per_prompt)


@contextmanager
def loaded(base_url: str, name: str, adapter_path: Path | None) -> Iterator[str]:
    """vLLM serves `adapter_path` as `name` inside the block (None: the base model, under its own
    name); a measurement-only name, unloaded after, so nothing routed changes."""
    from pipelines.deploy import admin

    if adapter_path is None:
        yield name
        return
    try:
        admin.load_adapter(base_url, name, adapter_path)
    except admin.VllmAdminError as err:
        if not (err.status == 400 and "already" in err.message):
            raise
    try:
        yield name
    finally:
        try:
            admin.unload_adapter(base_url, name)
        except admin.VllmAdminError:
            pass


def adapter_rate(base_url: str, adapter_path: Path | None, family: Any, name: str, **kw: Any) -> Rate:
    """`served_rate` of an adapter folder (None: the base model under `name`), loaded for the measurement."""
    with loaded(base_url, name, adapter_path) as model:
        return served_rate(base_url, model, family, **kw)


@dataclass(frozen=True)
class Sample:
    """One held-out prompt and each model's reply to it (same seed), with the users' verdict."""

    prompt: str
    replies: dict[str, tuple[str, bool]]    # model label -> (reply, liked)


def sample_replies(base_url: str, adapters: dict[str, Path | None], family: Any, *, prompts: int = 3,
                   max_tokens: int = 48, seed: int = 0) -> list[Sample]:
    """What a reviewer reads beside the rates: each model's reply to the first `prompts` held-out
    prompts, sampled as the traffic is (T=1) with the same seed per prompt for every model."""
    from pipelines.deploy import admin
    from pipelines.sim.families import Reply, model_input

    held = family.prompts("heldout")[:prompts]
    out: list[dict[str, tuple[str, bool]]] = [{} for _ in held]
    for label, path in adapters.items():
        with loaded(base_url, f"sample.{label}", path) as model:
            for i, messages in enumerate(held):
                got = admin.complete(base_url, model, messages=model_input(family, messages), max_tokens=max_tokens,
                                     temperature=1.0, top_p=1.0, seed=seed + i, logprobs=False, return_token_ids=True)
                out[i][label] = (got.reply, bool(family.liked(Reply(got.reply, len(got.token_ids), got.finish_reason))))
    return [Sample(m[-1]["content"], r) for m, r in zip(held, out)]


def format_samples(samples: list[Sample]) -> str:
    """The report's sample replies: prompt, then each model's reply and whether users like it."""
    lines = ["sample replies on held-out prompts (same seed per prompt; + liked by the simulated users):"]
    for s in samples:
        lines.append(f"  prompt: {s.prompt}")
        for label, (reply, liked) in s.replies.items():
            lines.append(f"    {label:<14} {'+' if liked else '-'} {' '.join(reply.split())[:300]}")
    return "\n".join(lines)
