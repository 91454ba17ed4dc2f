"""Pure loss functions of the learner: tensors and a config in, ``(loss, metrics)`` out.

No model calls here (prime-rl style): the learner computes log-probabilities, these functions
turn them into a scalar to backpropagate and a dict of floats to log. That keeps each formula
testable by hand on 2x3 tensors.

Shapes: B sequences, T completion positions. ``mask`` [B, T] is 1 on completion tokens that
count (not prompt, not padding). Log-probabilities are natural-log, fp32: bf16 logprobs differ
by up to 0.45 from the serving engine's, which would swamp the importance ratios (docs/measured.md).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, NamedTuple, Sequence

import torch
from torch import Tensor

from pipelines.config.train import KTOObjective, PolicyGradientObjective

MAX_LOG_RATIO = 20.0  # exp(20) ≈ 5e8: keeps exp() finite on garbage positions; caps act long before
ZERO_STD = 1e-6  # a group whose reward std is below this carries no signal


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] per position, in fp32: [B, T, V], [B, T] -> [B, T].

    gather − logsumexp avoids materialising a second [B, T, V] tensor (V = 49k for SmolLM2).
    Raw logprobs at temperature 1, the same quantity vLLM logs by default.
    """
    logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def sequence_logprobs(token_lp: Tensor, mask: Tensor) -> Tensor:
    """log π(y|x) = Σ_t mask·log π(y_t): [B, T] -> [B]."""
    return (token_lp * mask.to(token_lp.dtype)).sum(dim=-1)


def _correction(ratio: Tensor, cfg: PolicyGradientObjective) -> tuple[Tensor, Tensor]:
    """Detached per-token coefficient c(ρ) and a bool map of the tokens the correction changed."""
    if cfg.correction == "tis":  # truncated IS: min(ρ, C)
        return ratio.clamp(max=cfg.tis_cap), ratio > cfg.tis_cap
    if cfg.correction == "cispo":  # clipped IS weight, gradient only through log π
        lo, hi = 1.0 - cfg.cispo_eps_low, 1.0 + cfg.cispo_eps_high
        return ratio.clamp(lo, hi), (ratio < lo) | (ratio > hi)
    if cfg.correction == "mis":  # masked IS: ρ inside [C_min, C_max], else the token is dropped
        keep = (ratio >= cfg.mis_min) & (ratio <= cfg.mis_max)
        return ratio * keep, ~keep
    raise ValueError(f"unknown correction {cfg.correction!r}")


def policy_gradient_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    ref_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    cfg: PolicyGradientObjective,
    *,
    sample_weights: Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Off-policy-corrected policy gradient with a k3 KL penalty, aggregated per token.

    ρ_t = exp(log π_θ − log q) (q = ``behaviour_logprobs`` logged at serving; never the trainer's
    own old policy: treating π_old as the rollout policy is a known collapse), c = sg(correction(ρ))
    as in :class:`PolicyGradientObjective`, k3_t = exp(d) − d − 1 with d = log π_ref − log π_θ
    (unbiased, ≥ 0, 0 iff equal; Schulman 2020):

        L = Σ_{b,t} mask·w_b·( −c_t·A_b·log π_θ,t + kl_coef·k3_t ) / N,   N = Σ mask

    Why Σ/N over the whole batch (DAPO, Dr. GRPO) and not a mean per sequence first: with a
    per-sequence mean, a token of a 200-token reply weighs 1/10 of a token of a 20-token reply,
    so long wrong replies are barely penalised and short right ones over-rewarded (length bias).
    Here every token weighs 1/N whatever its sequence's length: neither long nor short is
    favoured per token. Pass ``num_tokens`` = the token count of the whole optimizer step when
    accumulating micro-batches, so the split does not re-weight them. ``sample_weights`` [B]
    scale whole samples (staleness down-weighting); MIS-dropped tokens keep their KL term and
    stay in N, so dropping tokens never up-weights the rest.

    With ρ ≡ 1 and kl_coef = 0 this is REINFORCE: −Σ A·log π / N.
    """
    m = mask.to(logprobs.dtype)
    valid = m > 0
    n = float(num_tokens) if num_tokens is not None else float(m.sum().item())
    denom = max(n, 1.0)
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)  # [B, 1]

    # where(): padding may hold -inf/NaN logprobs; 0·inf would poison the sums and gradients.
    logprobs = torch.where(valid, logprobs, torch.zeros_like(logprobs))
    log_ratio = torch.where(valid, logprobs.detach() - behaviour_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    coef, changed = _correction(ratio, cfg)
    pg_token = -coef.detach() * adv * logprobs

    if ref_logprobs is not None and cfg.kl_coef > 0:
        d = torch.where(valid, ref_logprobs.detach() - logprobs, torch.zeros_like(logprobs))
        d = d.clamp(max=MAX_LOG_RATIO)
        k3 = torch.exp(d) - d - 1.0
    else:
        k3 = torch.zeros_like(logprobs)

    w = m if sample_weights is None else m * sample_weights.to(logprobs.dtype).unsqueeze(-1)
    pg_loss = (pg_token * w).sum() / denom
    kl_loss = cfg.kl_coef * (k3 * w).sum() / denom
    loss = pg_loss + kl_loss

    with torch.no_grad():
        tokens = int(valid.sum().item())
        r = ratio[valid]
        metrics = {
            "loss": float(loss.item()),
            "pg_loss": float(pg_loss.item()),
            "kl_loss": float(kl_loss.item()),
            "kl": float(k3[valid].mean().item()) if tokens else math.nan,
            "ratio_mean": float(r.mean().item()) if tokens else math.nan,
            "ratio_max": float(r.max().item()) if tokens else math.nan,
            "ratio_min": float(r.min().item()) if tokens else math.nan,
            "clip_frac": float(changed[valid].float().mean().item()) if tokens else math.nan,
            "adv_mean": float(advantages.float().mean().item()),
            "adv_std": float(advantages.float().std(unbiased=False).item()),
            "logprob_mean": float(logprobs.detach()[valid].mean().item()) if tokens else math.nan,
            "tokens": float(tokens),
        }
    return loss, metrics


def positive_bc_loss(
    logprobs: Tensor,
    mask: Tensor,
    positive: Tensor,
    coef: float,
    *,
    sample_weights: Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Filtered behaviour cloning on liked turns, token-normalized like :func:`policy_gradient_loss`:

        L = coef · Σ_{b positive, t} mask·w_b·(−log π_θ,t) / N,   N = Σ mask (or ``num_tokens``)

    N counts every token of the step, positive or not, so the term's weight per liked token is
    the PG term's and the micro-batch split does not change it. It has no KL of its own: it is
    added to the PG loss of the same tokens, whose k3 term keeps π_θ near the reference.

    Bias, on purpose: this is not an unbiased policy-gradient estimator. It raises the likelihood
    of liked replies in proportion to how often the behaviour policy produced them (a frequent
    liked reply is imitated more than a rare one) and ignores q (no importance correction). It is
    a push toward what users liked when positives are too rare for the advantage alone, leashed
    by the KL term; ``coef`` = 0 turns it off.
    """
    m = mask.to(logprobs.dtype)
    valid = m > 0
    n = float(num_tokens) if num_tokens is not None else float(m.sum().item())
    denom = max(n, 1.0)
    logprobs = torch.where(valid, logprobs, torch.zeros_like(logprobs))  # padding may hold -inf/NaN
    w = m * positive.to(logprobs.dtype).unsqueeze(-1)
    if sample_weights is not None:
        w = w * sample_weights.to(logprobs.dtype).unsqueeze(-1)
    nll = -(logprobs * w).sum() / denom
    loss = float(coef) * nll
    with torch.no_grad():
        pos_tok = valid & (positive.unsqueeze(-1) > 0)
        metrics = {
            "bc_loss": float(loss.item()),
            "bc_nll": float(-logprobs.detach()[pos_tok].mean().item()) if pos_tok.any() else math.nan,
            "bc_tokens": float(pos_tok.sum().item()),
            "bc_samples": float((positive > 0).sum().item()),
        }
    return loss, metrics


class Advantages(NamedTuple):
    advantages: Tensor  # [B] float32, 0 where not kept
    keep: Tensor  # [B] bool: False = the sample carries no signal (drop it from the batch)
    baselines: dict[Hashable, float]  # updated per-task running baselines (input is not mutated)
    metrics: dict[str, float]


def compute_advantages(
    rewards: Tensor | Sequence[float],
    group_ids: Sequence[Hashable | None],
    task_ids: Sequence[Hashable],
    task_baselines: dict[Hashable, float],
    cfg: PolicyGradientObjective,
) -> Advantages:
    """Sequence advantages A_i = (R_i − b_i) / s, with a mask of the samples worth training on.

    Baseline b_i:
    - group (GRPO): samples sharing a group id, in a group of ≥ ``group_min_size``, use the
      group mean, when the group's rewards differ.
    - a *uniform* group (all rewards equal, std < 1e-6) has no signal under its own mean.
      ``cfg.uniform_groups='task_baseline'`` centres its samples on the task baseline below, the
      running EMA if the task has one, else the leave-one-out mean over ALL other samples of the
      task in this batch (grouped or not); 'drop' discards the group (keep=False).
      Trade-off: the group mean removes the prompt's difficulty from the advantage (low variance)
      but is blind whenever a group is uniform, which with 4 samples and a 2-10% base rate is
      most groups, and most liked replies. The task baseline sees them (an all-liked group in a
      mostly-disliked batch gets a large positive advantage, an all-disliked one a small negative
      one) at the price of variance: an easy prompt's all-liked group is credited with what the
      prompt did. Neither baseline depends on the sample's own reply, so neither adds bias.
    - ungrouped samples: the running per-task baseline; a task seen for the first time uses the
      leave-one-out mean of its other ungrouped samples in this batch (RLOO); a lone first
      sample has no baseline and gets keep=False.
    The EMA is updated only after the advantages are computed, so no b_i contains R_i (a
    baseline that includes the sample's own reward biases its advantage toward zero).
    A sample whose centered value is |R − b| < 1e-6 carries no signal either (e.g. a batch where
    every reward is equal) and gets keep=False: it would only add KL and dilute N.

    Scale s (``cfg.advantage_norm``): 'batch' = RMS of the kept centered values (scale only;
    grouped values have zero mean already); 'group' = each group's unbiased std (GRPO), samples
    centred on a task baseline use their RMS; 'none' = 1 (Dr. GRPO). A scale below 1e-6 is left
    at 1. One scale for the batch keeps the ratios of the centered values: with one liked group
    among many disliked ones, the RMS is small (dominated by the many small negatives), so the
    liked replies' |A| is large, ≈ sqrt(B / n_liked) when they are rare.

    The EMA update, per task present: b ← m if new else decay·b + (1−decay)·m, m = the batch
    mean reward of that task (all its samples, grouped or not).

    Metrics count what was dropped and why: ``zero_var_groups`` uniform groups seen,
    ``uniform_rebased`` their samples centred on the task baseline, ``dropped_uniform`` their
    samples discarded ('drop'), ``dropped_no_baseline``, ``dropped_zero_advantage``.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    B = r.numel()
    if not (len(group_ids) == len(task_ids) == B):
        raise ValueError(f"rewards ({B}), group_ids ({len(group_ids)}) and task_ids ({len(task_ids)}) must have one entry per sample")
    if not torch.isfinite(r).all():
        raise ValueError(f"rewards contain NaN/inf at positions {torch.nonzero(~torch.isfinite(r)).flatten().tolist()}")

    centered = torch.zeros(B, dtype=torch.float64)
    keep = torch.zeros(B, dtype=torch.bool)
    scale = torch.ones(B, dtype=torch.float64)
    in_group = torch.zeros(B, dtype=torch.bool)
    on_task_baseline = torch.zeros(B, dtype=torch.bool)  # centred on the task's b, not a group mean
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        if g is not None:
            members[g].append(i)

    zero_var_groups = dropped_uniform = 0
    rebase: list[int] = []  # samples of uniform groups, centred on the task baseline below
    for idx in members.values():
        if len(idx) < cfg.group_min_size:
            continue
        ix = torch.tensor(idx)
        in_group[ix] = True
        std = r[ix].std(unbiased=True)
        if std < ZERO_STD:
            zero_var_groups += 1
            if cfg.uniform_groups == "drop":
                dropped_uniform += len(idx)
            else:
                rebase.extend(idx)
            continue
        centered[ix] = r[ix] - r[ix].mean()
        keep[ix] = True
        if cfg.advantage_norm == "group":
            scale[ix] = std

    by_task: dict[Hashable, list[int]] = defaultdict(list)
    ungrouped_by_task: dict[Hashable, list[int]] = defaultdict(list)
    for i, t in enumerate(task_ids):
        by_task[t].append(i)
        if not in_group[i]:
            ungrouped_by_task[t].append(i)
    task_sum = {t: float(r[idx].sum()) for t, idx in by_task.items()}

    no_baseline = 0
    for i in rebase:  # uniform groups: EMA, else leave-one-out over every other sample of the task
        task = task_ids[i]
        if task in task_baselines:
            b = float(task_baselines[task])
        elif len(by_task[task]) >= 2:
            b = (task_sum[task] - float(r[i])) / (len(by_task[task]) - 1)
        else:  # unreachable for groups of >= 2, kept for clarity
            no_baseline += 1
            continue
        centered[i] = r[i] - b
        keep[i] = on_task_baseline[i] = True
    for task, idx in ungrouped_by_task.items():
        for i in idx:
            if task in task_baselines:
                b = float(task_baselines[task])
            elif len(idx) >= 2:
                b = (float(r[idx].sum()) - float(r[i])) / (len(idx) - 1)  # leave-one-out
            else:
                no_baseline += 1
                continue
            centered[i] = r[i] - b
            keep[i] = on_task_baseline[i] = True

    no_signal = keep & (centered.abs() < ZERO_STD)
    keep &= ~no_signal

    task_kept = keep & on_task_baseline
    if cfg.advantage_norm == "batch" and keep.any():
        scale[:] = _rms_or_one(centered[keep])
    elif cfg.advantage_norm == "group" and task_kept.any():
        scale[task_kept] = _rms_or_one(centered[task_kept])
    adv = torch.where(keep, centered / scale, torch.zeros_like(centered))

    baselines = dict(task_baselines)
    for task, idx in by_task.items():
        mean = float(r[idx].mean())
        old = baselines.get(task)
        baselines[task] = mean if old is None else cfg.baseline_ema_decay * old + (1 - cfg.baseline_ema_decay) * mean

    kept = adv[keep]
    metrics = {
        "reward_mean": float(r.mean()) if B else math.nan,
        "adv_mean": float(kept.mean()) if kept.numel() else math.nan,
        "adv_std": float(kept.std(unbiased=False)) if kept.numel() else math.nan,
        "samples": float(B),
        "kept": float(keep.sum()),
        "grouped": float(in_group.sum()),
        "zero_var_groups": float(zero_var_groups),
        "uniform_rebased": float((in_group & on_task_baseline).sum()),
        "dropped_uniform": float(dropped_uniform),
        "dropped_no_baseline": float(no_baseline),
        "dropped_zero_advantage": float(no_signal.sum()),
    }
    return Advantages(adv.float(), keep, baselines, metrics)


def _rms_or_one(x: Tensor) -> Tensor:
    rms = x.pow(2).mean().sqrt()
    return rms if rms >= ZERO_STD else torch.ones((), dtype=x.dtype)


def kto_loss(
    policy_logps: Tensor,
    ref_logps: Tensor,
    desirable: Tensor,
    cfg: KTOObjective,
    *,
    kl_policy_logps: Tensor | None = None,
    kl_ref_logps: Tensor | None = None,
    sample_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization").

    Inputs are *sequence* log-probabilities [B] (sum over completion tokens, see
    :func:`sequence_logprobs`); ``desirable`` [B] bool (thumbs up). With r = log π_θ − log π_ref:

        z₀ = max(0, mean(r_KL)).detach()       (batch KL estimate; TRL computes r_KL on
                                                 mismatched prompt/completion pairs, passed via
                                                 ``kl_*_logps``; by default the batch itself)
        v  = σ(β(r − z₀)) if desirable else σ(β(z₀ − r))
        L  = Σ_i s_i·w(y_i)·(1 − v_i) / B,      w = λ_D or λ_U, s = ``sample_weights``

    z₀ is detached and clamped ≥ 0 as in the paper/TRL: it is a reference point, not a target.
    Sums (not means) over tokens are the paper's choice; β absorbs the scale.
    """
    desirable = desirable.to(torch.bool)
    r = policy_logps - ref_logps.detach()
    if kl_policy_logps is not None and kl_ref_logps is not None:
        kl_est = (kl_policy_logps - kl_ref_logps).mean()
    else:
        kl_est = r.mean()
    z0 = kl_est.detach().clamp(min=0.0)
    v = torch.where(desirable, torch.sigmoid(cfg.beta * (r - z0)), torch.sigmoid(cfg.beta * (z0 - r)))
    w = torch.where(desirable, torch.full_like(r, cfg.desirable_weight), torch.full_like(r, cfg.undesirable_weight))
    per = w * (1.0 - v)
    if sample_weights is not None:
        per = per * sample_weights.to(per.dtype)
    loss = per.sum() / max(r.numel(), 1)

    with torch.no_grad():
        rd, ru = r[desirable], r[~desirable]
        metrics = {
            "loss": float(loss.item()),
            "kl": float(z0.item()),
            "reward_desirable": float(cfg.beta * rd.mean()) if rd.numel() else math.nan,
            "reward_undesirable": float(cfg.beta * ru.mean()) if ru.numel() else math.nan,
            "logratio_mean": float(r.mean()) if r.numel() else math.nan,
            "n_desirable": float(rd.numel()),
            "n_undesirable": float(ru.numel()),
        }
    return loss, metrics
