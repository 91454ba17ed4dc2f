"""``[gate]`` and ``[gate.signatures]``: how the promotion gate evaluates and decides (docs/gate.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION

TESTS = ("bootstrap", "sign")  # paired bootstrap of the mean difference | exact sign test


@dataclass(config=SECTION)
class SignatureConfig:
    """Behaviour signatures (signatures.py): rates measured on the gate's own replies of candidate
    and champion (same items, same seeds). A signature blocks (REJECT) when the candidate's rate
    rises by more than its max increase AND the rise is significant at the gate's alpha. None =
    measured and logged, never blocking. Defaults: the reward hacks seen in production
    (docs/measured.md; Cursor's real-time RL): broken tool calls, needless clarifying questions."""

    enabled: bool = True
    tool_error: float | None = 0.05      # broken calls / replies that attempt a call: a model that
                                         #   calls tools must not get worse at it
    broken_call: float | None = 0.05     # replies carrying a broken call / all replies: catches more
                                         #   broken calls even when the per-attempt rate is unchanged
                                         #   (or already saturated, as on a weak base)
    attempted_call: float | None = None  # replies that attempt a call / all: a rise can be the point
                                         #   of training, so only reported by default
    clarify: float | None = 0.10         # the reward spec's "clarify" dodge (no call, ends with '?',
                                         #   <= clarify_max_chars): asking back is sometimes right
    refusal: float | None = 0.05         # refusal phrases (pipelines/contract/behaviour.py)
    length_ratio_min: float | None = 0.5  # mean reply length candidate / champion must stay within
    length_ratio_max: float | None = 2.0  #   [min, max]: collapse to short non-answers, or rambling
    clarify_max_chars: int = 300         # = reward spec Dodge.clarify_max_chars

    def __post_init__(self) -> None:
        for name in ("tool_error", "broken_call", "attempted_call", "clarify", "refusal"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v < 1.0:
                raise ValueError(f"gate.signatures.{name}={v} must be a max increase of a rate in [0, 1), "
                                 f"e.g. 0.05, or None to only report it")
        lo, hi = self.length_ratio_min, self.length_ratio_max
        if (lo is not None and not 0 < lo <= 1) or (hi is not None and hi < 1):
            raise ValueError(f"gate.signatures.length_ratio_min={lo} must be in (0, 1] and length_ratio_max={hi} "
                             f">= 1 (e.g. 0.5 and 2.0), or None")
        if self.clarify_max_chars < 1:
            raise ValueError(f"gate.signatures.clarify_max_chars={self.clarify_max_chars} must be >= 1 (300 as "
                             f"the reward spec)")


@dataclass(config=SECTION)
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
    temperature: float = 1.0             # identical sampling for candidate and champion; 1.0 = as the
                                         #   traffic samples: the gate judges the policy users meet, and
                                         #   a greedy reply hides a shift in the sampled distribution
                                         #   (a preference liked at 2% rarely wins the argmax). It also
                                         #   lets sequential looks add samples; 0 = greedy, one look
    top_p: float = 1.0
    max_tokens: int = 64                 # the traffic's replies are <= 48 tokens (sim); longer evals
                                         #   only cost CPU time in vLLM
    samples_per_item: int = 2            # first look; each further look doubles it (max_looks).
                                         #   >1 only makes sense with temperature > 0
    concurrency: int = 16                # requests in flight to vLLM (it batches them; 16 kept the CPU
                                         #   server busy in the demo's gate)
    max_kl: float | None = 0.5           # KL budget: reject if the learner's last-step KL to the
                                         #   base (adapter meta metrics.kl) exceeds it; None = off.
                                         #   docs/measured.md: healthy ~0.08, collapsed ~1.0
    review: bool = False                 # hold passing candidates until a person approves
    approval_tag: str = "tracerl.approved"  # set to "true" on the version in the MLflow UI
    vllm_url: str | None = None          # None = the embedded vLLM (started or reused)
    judge_url: str | None = None         # OpenAI-compatible endpoint for llm_judge criteria
    judge_model: str = "judge"
    judge_api_key_env: str = "TRACERL_JUDGE_API_KEY"  # env var holding the judge's key, if any
    fail_on_missing_suites: bool = True  # no suites for a tenant/task: reject (else pass)
    power: float = 0.8                   # power for the minimum detectable effect (power.py): the
                                         #   gain a suite finds 80% of the time (the usual planning value)
    max_mde: float = 0.15                # warn (not block) when a suite's a priori MDE exceeds it: a
                                         #   suite that cannot see +0.15 cannot tell training from noise
    max_looks: int = 3                   # sequential sampling (sequential.py): a primary with a positive
                                         #   but unproven gain is re-sampled with twice the samples per
                                         #   item, up to this many looks; each look tests at
                                         #   alpha / max_looks (Bonferroni). Needs temperature > 0
                                         #   (greedy replies repeat): at temperature 0 there is one look at alpha
    futility_gain: float = 0.01          # stop early (reject) once the upper bound of the gain is below
                                         #   max(min_gain, this): more samples would not reach a gain worth having
    reuse_replies: bool = True           # keep each model's eval replies (<home>/gate_replies/<tenant>/<task>, keyed by
                                         #   weights, sampling, item and seed: reply_cache.py), so the
                                         #   champion, asked what it was asked as a candidate, is not
                                         #   asked again: each gate generates for one arm
    side_by_side: int = 8                # recent real prompts (never eval items) answered by candidate and
                                         #   champion for the reviewer, with the primary scorer's scores:
                                         #   gate/side_by_side.json on the gate run; 0 = off
    signatures: SignatureConfig = field(default_factory=SignatureConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.side_by_side <= 100:
            raise ValueError(f"gate.side_by_side={self.side_by_side} must be in [0, 100] prompts (0 = off)")
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
        if not 0.5 <= self.power < 1.0:
            raise ValueError(f"gate.power={self.power} must be in [0.5, 1), e.g. 0.8")
        if not 0.0 < self.max_mde <= 1.0:
            raise ValueError(f"gate.max_mde={self.max_mde} must be in (0, 1] (a gain of the mean score), e.g. 0.15")
        if not 1 <= self.max_looks <= 6:
            raise ValueError(f"gate.max_looks={self.max_looks} must be in [1, 6] (samples double each look: "
                             f"6 looks = 32x the first); 1 turns sequential sampling off")
        if self.futility_gain < 0:
            raise ValueError(f"gate.futility_gain={self.futility_gain} must be >= 0 (0 stops only when even the "
                             f"upper bound shows no gain)")

    @property
    def looks(self) -> int:
        """Looks actually taken: more samples of greedy replies would be the same replies."""
        return self.max_looks if self.temperature > 0 else 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def gate_config(cfg: Any) -> GateConfig:
    """``cfg.gate``, or the defaults for an object without one (a bare namespace some callers and
    tests pass instead of a whole TracerlConfig)."""
    return getattr(cfg, "gate", None) or GateConfig()
