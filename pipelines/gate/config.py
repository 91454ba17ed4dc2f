"""Gate settings (proposed ``TracerlConfig.gate``). Torch-free, dagster-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TESTS = ("bootstrap", "sign")  # paired bootstrap of the mean difference | exact sign test


@dataclass
class GateConfig:
    """How the gate evaluates and decides.

    Statistics (stats.py): per suite, per-item score differences candidate - champion.
    ``bootstrap``: one-sided percentile CI of the mean difference at ``confidence``;
    ``sign``: exact binomial sign test on untied pairs (McNemar's exact test for 0/1 scores).
    """

    suites_dir: str = "evals"            # <suites_dir>/<tenant>/<task>/*.toml; outside the lake
    test: str = "bootstrap"              # one of TESTS
    confidence: float = 0.95             # one-sided; alpha = 1 - confidence
    n_bootstrap: int = 2000              # bootstrap resamples
    seed: int = 0                        # bootstrap RNG and per-item sampling seeds
    min_gain: float = 0.0                # primary: required mean gain on top of significance
    temperature: float = 0.0             # identical sampling for candidate and champion
    top_p: float = 1.0
    max_tokens: int = 128
    samples_per_item: int = 1            # >1 only makes sense with temperature > 0
    concurrency: int = 8                 # requests in flight to vLLM (it batches them)
    max_kl: float | None = 0.5           # KL budget: reject if the learner's last-step KL to the
                                         #   base (adapter meta metrics.kl) exceeds it; None = off.
                                         #   REFERENCE.md: healthy ~0.08, collapsed ~1.0
    review: bool = False                 # hold passing candidates until a person approves
    approval_tag: str = "tracerl.approved"  # set to "true" on the version in the MLflow UI
    vllm_url: str | None = None          # None = the embedded vLLM (started or reused)
    judge_url: str | None = None         # OpenAI-compatible endpoint for llm_judge criteria
    judge_model: str = "judge"
    judge_api_key_env: str = "TRACERL_JUDGE_API_KEY"  # env var holding the judge's key, if any
    fail_on_missing_suites: bool = True  # no suites for a tenant/task: reject (else pass)

    def __post_init__(self) -> None:
        if self.test not in TESTS:
            raise ValueError(f"gate.test={self.test!r}: use one of {TESTS}")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"gate.confidence={self.confidence} must be in [0.5, 1), e.g. 0.95")
        if self.n_bootstrap < 100:
            raise ValueError(f"gate.n_bootstrap={self.n_bootstrap} must be >= 100 (2000 is typical)")
        if self.samples_per_item < 1:
            raise ValueError(f"gate.samples_per_item={self.samples_per_item} must be >= 1")
        if self.samples_per_item > 1 and self.temperature == 0:
            raise ValueError(f"gate.samples_per_item={self.samples_per_item} with temperature=0 repeats "
                             f"identical greedy replies; set temperature > 0 or samples_per_item = 1")
        if self.max_kl is not None and self.max_kl <= 0:
            raise ValueError(f"gate.max_kl={self.max_kl} must be > 0, or None to turn the KL budget off")
        if self.max_tokens < 1 or self.concurrency < 1:
            raise ValueError(f"gate.max_tokens={self.max_tokens} and gate.concurrency={self.concurrency} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def gate_config(cfg: Any) -> GateConfig:
    """``cfg.gate`` once TracerlConfig has it, else the defaults."""
    return getattr(cfg, "gate", None) or GateConfig()
