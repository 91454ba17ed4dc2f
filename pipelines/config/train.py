"""``[train]``: typed settings of the learner: LoRA shape, objective, optimizer, staleness, seed.

One dataclass per concern, every option documented beside its default (units, allowed values,
why that default). ``__post_init__`` rejects bad values with a message that quotes the value and
says the fix. The objective is a tagged union on ``kind``, a pydantic discriminated union
(``kind`` may be left out: policy gradient): the learner dispatches on the config *type* once,
never on strings in several places. No torch import here: parsing a config must stay fast and
must work where torch is absent.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Tag
from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION, parse
from pipelines.config.serve import LORA_RANKS as VLLM_LORA_RANKS  # what the server can host


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(config=SECTION, frozen=True)
class LoraSettings:
    """LoRA adapter shape (peft). The adapter, not the base, is what the learner trains and ships."""

    r: int = 16
    """Rank. Must be one of vLLM's ``--max-lora-rank`` values so the server can host it."""
    alpha: int = 32
    """Scale numerator: the update is (alpha / r)·B·A. alpha = 2r is the common default."""
    dropout: float = 0.0
    """LoRA dropout. 0 on purpose: dropout makes the training forward differ from the serving
    forward, so on-policy tokens would show ρ = π_θ/q ≠ 1 and the IS correction would fight noise."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Linear layers that get adapters; attention projections as in the measured SmolLM2 run."""

    def __post_init__(self) -> None:
        _check(self.r in VLLM_LORA_RANKS,
               f"lora.r={self.r!r} is not a rank vLLM serves; use one of {VLLM_LORA_RANKS}")
        _check(self.alpha > 0, f"lora.alpha={self.alpha!r} must be > 0 (try 2*r = {2 * self.r})")
        _check(0.0 <= self.dropout < 1.0, f"lora.dropout={self.dropout!r} must be in [0, 1); 0 keeps ρ=1 on-policy")
        _check(len(self.target_modules) > 0, "lora.target_modules is empty; name at least one layer, e.g. ('q_proj', 'v_proj')")

    def to_peft(self):
        """The equivalent ``peft.LoraConfig`` (imports peft lazily)."""
        from peft import LoraConfig

        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.target_modules), bias="none", task_type="CAUSAL_LM")


@dataclass(config=SECTION, frozen=True)
class PolicyGradientObjective:
    """Off-policy-corrected policy gradient on scalar rewards (thumbs, edits kept, test passes).

    Token loss, with q the behaviour policy that served the turn (logprobs logged by vLLM),
    ρ = exp(log π_θ − log q), A the sequence advantage, and the reference π_ref = the same base
    with adapters disabled:  ℓ_t = −c(ρ_t)·A·log π_θ(t) + kl_coef·k3_t, summed over all tokens of
    the batch and divided by their count. ``c`` is the correction (all detached):
      tis:   c = min(ρ, tis_cap)                       (truncated IS; Yao et al. 2025)
      cispo: c = clip(ρ, 1−cispo_eps_low, 1+cispo_eps_high)   (MiniMax-M1, 2025)
      mis:   c = ρ if mis_min ≤ ρ ≤ mis_max else 0 (token dropped)  (masked IS)
    """

    kind: Literal["policy_gradient"] = "policy_gradient"
    correction: Literal["tis", "cispo", "mis"] = "tis"
    """Importance correction for serving-vs-training mismatch and stale versions (see above)."""
    tis_cap: float = 2.0
    """C in min(ρ, C). 2.0 = the clip(ρ, 0, 2) measured to move SmolLM2 here (docs/measured.md)."""
    cispo_eps_low: float = 1.0
    """CISPO lower clip 1−ε_low; 1.0 means no lower bound (MiniMax-M1 sets ε_low large)."""
    cispo_eps_high: float = 1.0
    """CISPO upper clip 1+ε_high; 1.0 gives an upper bound of 2, like tis_cap."""
    mis_min: float = 0.5
    """MIS: tokens with ρ below this are dropped (the sample is too unlikely under π_θ)."""
    mis_max: float = 2.0
    """MIS: tokens with ρ above this are dropped (variance would explode)."""
    kl_coef: float = 0.02
    """Weight of the k3 KL estimator exp(r)−r−1, r = log π_ref − log π_θ, per token. 0.02 kept
    KL to base ≈ 0.08 over 5 iterations here; without it the policy drifts (docs/measured.md)."""
    group_min_size: int = 2
    """Samples sharing a prompt group id use the group mean as baseline when the group has at
    least this many members (GRPO/RLOO); other samples use the running per-task baseline."""
    baseline_ema_decay: float = 0.9
    """Per-task running baseline b ← decay·b + (1−decay)·mean(R of the task in the batch)."""
    advantage_norm: Literal["batch", "group", "none"] = "batch"
    """Divide centered rewards by: the std over the whole batch (REINFORCE++-style, one scale
    for grouped and ungrouped samples), each group's std (GRPO; known to up-weight groups that
    are almost all right or all wrong), or nothing (Dr. GRPO: unbiased, scale follows rewards)."""
    uniform_groups: Literal["task_baseline", "drop"] = "task_baseline"
    """A group whose rewards are all equal (all liked, or all disliked) has no signal under its own
    mean. 'task_baseline': centre its samples on the per-task baseline instead (the running EMA,
    else the leave-one-out mean of every other sample of the task in the batch), so an all-liked
    group in a mostly-disliked batch is pushed up hard and an all-disliked one down a little.
    'drop': discard such groups (plain GRPO). Default 'task_baseline' because with 4 samples per
    prompt and a 2-10% base rate most groups are uniform: 'drop' trained 8-12 of ~400 turns per
    iteration and threw away most liked replies (issue #13). The task baseline ignores prompt
    difficulty, so it adds variance (the prompt's share of the reward is credited to the reply);
    it adds no bias, since the baseline never depends on the sample's own reply."""
    positive_bc_coef: float = 0.0
    """Weight of an extra filtered behaviour-cloning term on turns with reward > ``positive_threshold``:
    coef·(−Σ mask·log π_θ)/N over those turns, N the step's token count (as the PG loss), the same
    k3 KL leash. Not an unbiased policy gradient: it imitates liked replies in proportion to how
    often the behaviour policy produced them and ignores q. 0 = off: on the tiny model with a sparse
    rule (~8% base rate, 3 iterations) coef 0.5 reached 0.81 held-out vs 0.85 without it, and
    after one iteration it was within the eval's noise (~±1.3 points) of coef 0: no clear gain."""
    positive_threshold: float = 0.0
    """Turns with reward strictly above this count as positive for ``positive_bc_coef``. 0.0: a
    thumbs-up (+1) counts, neutral (0) and thumbs-down do not."""

    def __post_init__(self) -> None:
        _check(self.correction in ("tis", "cispo", "mis"),
               f"objective.correction={self.correction!r}; choose 'tis', 'cispo' or 'mis'")
        _check(self.tis_cap >= 1.0, f"objective.tis_cap={self.tis_cap!r} must be >= 1 (a cap below 1 shrinks on-policy tokens)")
        _check(0.0 <= self.cispo_eps_low <= 1.0, f"objective.cispo_eps_low={self.cispo_eps_low!r} must be in [0, 1] (lower clip 1-eps >= 0)")
        _check(self.cispo_eps_high >= 0.0, f"objective.cispo_eps_high={self.cispo_eps_high!r} must be >= 0")
        _check(0.0 <= self.mis_min <= 1.0 <= self.mis_max,
               f"objective.mis_min={self.mis_min!r}, mis_max={self.mis_max!r}: need 0 <= mis_min <= 1 <= mis_max so on-policy tokens (ρ=1) are kept")
        _check(self.kl_coef >= 0.0, f"objective.kl_coef={self.kl_coef!r} must be >= 0 (0 disables the KL term)")
        _check(self.group_min_size >= 2, f"objective.group_min_size={self.group_min_size!r} must be >= 2: a group of one has no baseline")
        _check(0.0 <= self.baseline_ema_decay < 1.0, f"objective.baseline_ema_decay={self.baseline_ema_decay!r} must be in [0, 1)")
        _check(self.advantage_norm in ("batch", "group", "none"),
               f"objective.advantage_norm={self.advantage_norm!r}; choose 'batch', 'group' or 'none'")
        _check(self.uniform_groups in ("task_baseline", "drop"),
               f"objective.uniform_groups={self.uniform_groups!r}; choose 'task_baseline' or 'drop'")
        _check(math.isfinite(self.positive_bc_coef) and self.positive_bc_coef >= 0.0,
               f"objective.positive_bc_coef={self.positive_bc_coef!r} must be a finite number >= 0 (0 disables the term)")
        _check(math.isfinite(self.positive_threshold),
               f"objective.positive_threshold={self.positive_threshold!r} must be finite (0.0: thumbs-up only)")


@dataclass(config=SECTION, frozen=True)
class KTOObjective:
    """KTO (Ethayarajh et al. 2024) on thumbs up/down without pairs: L = E[w(y)(1 − v)],
    v = σ(β(log π/π_ref − z₀)) for desirable and σ(β(z₀ − log π/π_ref)) for undesirable,
    log π/π_ref summed over the completion's tokens, z₀ a detached batch KL estimate ≥ 0."""

    kind: Literal["kto"] = "kto"
    beta: float = 0.1
    """Sharpness of the value function; larger = stays closer to the reference (TRL default 0.1)."""
    desirable_weight: float = 1.0
    """λ_D. Keep λ_D·n_D / (λ_U·n_U) in [1, 4/3] (paper): raise it when thumbs-up are rare."""
    undesirable_weight: float = 1.0
    """λ_U, the weight of thumbs-down samples."""

    def __post_init__(self) -> None:
        _check(self.beta > 0.0, f"objective.beta={self.beta!r} must be > 0 (typical 0.01-0.5)")
        _check(self.desirable_weight > 0.0, f"objective.desirable_weight={self.desirable_weight!r} must be > 0")
        _check(self.undesirable_weight > 0.0, f"objective.undesirable_weight={self.undesirable_weight!r} must be > 0")


OBJECTIVES: dict[str, type] = {"policy_gradient": PolicyGradientObjective, "kto": KTOObjective}


def _objective_kind(value: Any) -> Any:
    """The union's tag: ``kind`` of a table (default policy gradient) or of a built objective."""
    if isinstance(value, dict):
        return value.get("kind", "policy_gradient")
    return getattr(value, "kind", None)


Objective = Annotated[
    Union[Annotated[PolicyGradientObjective, Tag("policy_gradient")], Annotated[KTOObjective, Tag("kto")]],
    Discriminator(_objective_kind),
]


@dataclass(config=SECTION, frozen=True)
class OptimizerSettings:
    """AdamW over the LoRA parameters only."""

    lr: float = 5e-4
    """Learning rate. 5e-4 is what `make demo` measured learning with on SmolLM2 (live reward
    0.073 -> 0.688 in 3 gated iterations, KL within the gate's budget); with dense thumbs on every
    turn it over-optimized in 2 iterations, but shipped traffic votes on ~20% of turns, and the
    branch's KL reset (learner.branch_max_kl) and the gate's max_kl bound the drift. 1e-4 moved
    SmolLM2 too slowly for a preference liked on 2% of replies."""
    weight_decay: float = 0.0
    """Decoupled weight decay on LoRA matrices (0: the KL term already anchors the policy)."""
    betas: tuple[float, float] = (0.9, 0.999)
    steps_per_iteration: int = 4
    """Optimizer steps per learner iteration (each over a fresh slice of the iteration's batch)."""
    grad_clip: float = 1.0
    """Max global grad norm before each step; 0 disables clipping."""
    micro_batch_size: int = 8
    """Sequences per forward/backward; gradients accumulate to the step. Bounds peak memory
    (16 x 128 tokens of SmolLM2 peaked at 5.9 GB RSS here). Loss normalization uses the token
    count of the whole step, so the split does not change the gradient."""

    def __post_init__(self) -> None:
        _check(0.0 < self.lr <= 1e-2, f"optimizer.lr={self.lr!r} must be in (0, 1e-2]; LoRA RL uses ~1e-5..5e-4")
        _check(self.weight_decay >= 0.0, f"optimizer.weight_decay={self.weight_decay!r} must be >= 0")
        _check(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas),
               f"optimizer.betas={self.betas!r} must be two numbers in [0, 1)")
        _check(self.steps_per_iteration >= 1, f"optimizer.steps_per_iteration={self.steps_per_iteration!r} must be >= 1")
        _check(self.grad_clip >= 0.0, f"optimizer.grad_clip={self.grad_clip!r} must be >= 0 (0 disables)")
        _check(self.micro_batch_size >= 1, f"optimizer.micro_batch_size={self.micro_batch_size!r} must be >= 1")


@dataclass(config=SECTION, frozen=True)
class StalenessSettings:
    """What to do with samples served by an older adapter version than the one being trained.

    IS correction handles a small policy gap; many versions back, ρ is mostly clipped and the
    sample adds bias. Samples at most ``max_versions_behind`` old count fully; older ones are
    dropped or down-weighted.

    Why the defaults are lenient: the learner continues a training branch from its own latest
    (possibly rejected) candidate, while traffic is still served by the champion, so the learner
    is routinely several versions ahead of the data. The truncated-IS ratio π_θ/q against the
    logged behaviour logprobs already corrects that policy gap token by token; dropping old
    samples would throw away all the traffic of a long branch.
    """

    max_versions_behind: int = 8
    """K: samples from version v are fresh while (current − v) <= K. 8 covers a branch of several
    rejected candidates ahead of the serving champion (IS corrects the gap, see above)."""
    mode: Literal["drop", "downweight"] = "downweight"
    """Older than K: 'drop' them, or 'downweight' their loss by ``weight``. 'downweight': very old
    traffic still carries its reward signal, at half the say of fresh traffic."""
    weight: float = 0.5
    """Loss weight of a sample older than K in 'downweight' mode."""

    def __post_init__(self) -> None:
        _check(self.max_versions_behind >= 0, f"staleness.max_versions_behind={self.max_versions_behind!r} must be >= 0 (0 = on-policy only)")
        _check(self.mode in ("drop", "downweight"), f"staleness.mode={self.mode!r}; choose 'drop' or 'downweight'")
        _check(0.0 < self.weight <= 1.0, f"staleness.weight={self.weight!r} must be in (0, 1]; use mode='drop' for 0")

    def sample_weight(self, versions_behind: int) -> float:
        """Loss weight of one sample: 1 when fresh, ``weight`` or 0 (dropped) when older than K."""
        if versions_behind < 0:
            raise ValueError(f"versions_behind={versions_behind}: a sample cannot come from a newer adapter than the learner's")
        if versions_behind <= self.max_versions_behind:
            return 1.0
        return self.weight if self.mode == "downweight" else 0.0


@dataclass(config=SECTION, frozen=True)
class TrainConfig:
    """Everything the learner needs besides data; logged whole with every run (``to_dict``)."""

    base_model: str = "smollm2-135m"
    """'tiny', 'tiny:<seed>', 'smollm2-135m', a local HF folder, or a hub id (see registry)."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    objective: Objective = field(default_factory=PolicyGradientObjective)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    staleness: StalenessSettings = field(default_factory=StalenessSettings)
    seed: int = 0
    """Seeds torch for LoRA init and batch order: same data + seed = same adapter on one machine."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the learner runs. 'auto': the GPU when torch sees one, else the CPU. 'cuda' without a
    GPU is an error, not a silent fallback (pipelines/train/device.py)."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Autocast dtype of the forwards. 'auto': bf16 on a GPU that has it, fp32 on CPU. The LM head,
    logprobs, loss, weights and AdamW state stay fp32 in every case: bf16 logprobs differ from the
    engine's by up to ~0.45, which the importance ratio would read as off-policy drift."""

    def __post_init__(self) -> None:
        _check(bool(self.base_model.strip()), "base_model is empty; use 'tiny', 'smollm2-135m' or a model folder")
        _check(isinstance(self.objective, (PolicyGradientObjective, KTOObjective)),
               f"objective={self.objective!r} must be PolicyGradientObjective or KTOObjective")
        _check(self.seed >= 0, f"seed={self.seed!r} must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Build from plain dicts (TOML, Dagster run config, adapter meta); unknown keys are errors."""
        return parse(cls, data, "train")


def objective_from_dict(data: dict[str, Any]) -> Objective:
    """Pick the objective class from ``kind`` (default 'policy_gradient')."""
    return parse(Objective, data, "objective")
