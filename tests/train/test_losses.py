"""Hand-computed checks of each loss formula in pipelines.train.losses.

Every expected number below is derived in the comment beside it, not taken from the code.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.config.train import KTOObjective, PolicyGradientObjective
from pipelines.train.losses import (
    compute_advantages,
    kto_loss,
    policy_gradient_loss,
    positive_bc_loss,
    sequence_logprobs,
    token_logprobs,
)

LN = math.log


def leaf(values):
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def pg(correction="tis", kl_coef=0.0, **kw):
    return PolicyGradientObjective(correction=correction, kl_coef=kl_coef, **kw)


# ---------------------------------------------------------------- policy gradient


@pytest.mark.parametrize("correction", ["tis", "cispo", "mis"])
def test_on_policy_without_kl_is_reinforce(correction):
    # ρ = 1 everywhere (q = π_θ): every correction leaves c = 1, so L = −Σ A·log π / N.
    lp = leaf([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([2.0, -1.0])
    loss, m = policy_gradient_loss(lp, lp.detach().clone(), None, adv, mask, pg(correction))
    # N = 5; Σ A·logπ = 2·(−6) + (−1)·(−0.75) = −11.25 → L = 11.25 / 5 = 2.25
    assert loss.item() == pytest.approx(2.25)
    loss.backward()
    expected = torch.tensor([[-2 / 5] * 3, [1 / 5, 1 / 5, 0.0]])  # ∂L/∂logπ = −A/N, 0 off-mask
    assert torch.allclose(lp.grad, expected)
    assert m["tokens"] == 5 and m["ratio_mean"] == pytest.approx(1.0) and m["clip_frac"] == 0.0


def _ratios_case():
    # log q chosen so ρ = π_θ/q = [3, 0.5, 1] on one sequence with A = 1, N = 3
    lp = leaf([[-1.0, -1.0, -1.0]])
    behaviour = torch.tensor([[-1.0 - LN(3.0), -1.0 - LN(0.5), -1.0]])
    return lp, behaviour, torch.tensor([1.0]), torch.ones(1, 3)


def test_tis_caps_ratio_and_detaches_it():
    lp, q, adv, mask = _ratios_case()
    loss, m = policy_gradient_loss(lp, q, None, adv, mask, pg("tis", tis_cap=2.0))
    loss.backward()
    # c = min(ρ, 2) = [2, 0.5, 1]; ∂L/∂logπ = −c·A/N (ρ detached: no extra ρ·logπ term)
    assert torch.allclose(lp.grad, torch.tensor([[-2 / 3, -0.5 / 3, -1 / 3]]))
    assert loss.item() == pytest.approx(-(2 + 0.5 + 1) * -1.0 / 3)  # −Σ c·A·logπ / N = 3.5/3
    assert m["ratio_max"] == pytest.approx(3.0) and m["ratio_min"] == pytest.approx(0.5)
    assert m["clip_frac"] == pytest.approx(1 / 3)


def test_cispo_clips_both_sides_and_grad_flows_through_logpi_only():
    lp, q, adv, mask = _ratios_case()
    q = q.clone().requires_grad_(True)  # would receive gradient if ρ were not stop-gradient
    loss, m = policy_gradient_loss(lp, q, None, adv, mask, pg("cispo", cispo_eps_low=0.2, cispo_eps_high=0.2))
    loss.backward()
    # c = clip(ρ, 0.8, 1.2) = [1.2, 0.8, 1.0]
    assert torch.allclose(lp.grad, torch.tensor([[-1.2 / 3, -0.8 / 3, -1.0 / 3]]))
    assert q.grad is None or torch.count_nonzero(q.grad) == 0
    assert m["clip_frac"] == pytest.approx(2 / 3)


def test_mis_drops_tokens_outside_bounds_but_keeps_them_in_n():
    lp = leaf([[-1.0, -1.0, -1.0]])
    q = torch.tensor([[-1.0 - LN(3.0), -1.0 - LN(0.3), -1.0]])  # ρ = [3, 0.3, 1]
    loss, m = policy_gradient_loss(lp, q, None, torch.tensor([1.0]), torch.ones(1, 3),
                                   pg("mis", mis_min=0.5, mis_max=2.0))
    loss.backward()
    # c = [0, 0, 1]: only the last token; N stays 3 → L = −1·(−1)/3
    assert loss.item() == pytest.approx(1 / 3)
    assert torch.allclose(lp.grad, torch.tensor([[0.0, 0.0, -1 / 3]]))
    assert m["clip_frac"] == pytest.approx(2 / 3)


def test_mis_weights_in_range_tokens_by_rho():
    lp = leaf([[-1.0]])
    q = torch.tensor([[-1.0 - LN(1.5)]])  # ρ = 1.5, inside [0.5, 2]
    loss, _ = policy_gradient_loss(lp, q, None, torch.tensor([2.0]), torch.ones(1, 1), pg("mis"))
    loss.backward()
    assert lp.grad.item() == pytest.approx(-1.5 * 2.0)


def test_kl_is_zero_when_policy_equals_reference():
    lp = leaf([[-1.0, -2.0]])
    loss, m = policy_gradient_loss(lp, lp.detach(), lp.detach().clone(), torch.tensor([0.0]),
                                   torch.ones(1, 2), pg(kl_coef=0.5))
    loss.backward()
    assert m["kl"] == 0.0 and m["kl_loss"] == 0.0 and loss.item() == 0.0
    assert torch.count_nonzero(lp.grad) == 0  # A = 0 and KL at its minimum: no gradient


def test_kl_k3_value_and_gradient():
    # d = log π_ref − log π = ln 2 → k3 = e^d − d − 1 = 1 − ln 2; ∂k3/∂logπ = −(e^d − 1) = −1
    lp = leaf([[-1.0]])
    ref = torch.tensor([[-1.0 + LN(2.0)]])
    loss, m = policy_gradient_loss(lp, lp.detach(), ref, torch.tensor([0.0]), torch.ones(1, 1), pg(kl_coef=0.1))
    loss.backward()
    assert m["kl"] == pytest.approx(1 - LN(2.0), rel=1e-5)
    assert loss.item() == pytest.approx(0.1 * (1 - LN(2.0)), rel=1e-5)
    assert lp.grad.item() == pytest.approx(-0.1, rel=1e-5)


def test_token_level_aggregation_weighs_every_token_equally():
    # A 2-token and a 4-token reply with the same advantage. Per-sequence means would give
    # the short reply's tokens gradient A/2/B each and the long one's A/4/B; token-level
    # aggregation gives every token A/N with N = 6, so the long reply weighs twice the short
    # one in total (it has twice the tokens), never more per token.
    lp = leaf([[-1.0, -1.0, 0.0, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    loss, _ = policy_gradient_loss(lp, lp.detach(), None, torch.tensor([1.0, 1.0]), mask, pg())
    loss.backward()
    assert torch.allclose(lp.grad[mask.bool()], torch.full((6,), -1 / 6))
    # doubling the long reply's length keeps its per-token weight equal to the short one's
    lp2 = leaf([[-1.0] * 2 + [0.0] * 6, [-1.0] * 8])
    mask2 = torch.tensor([[1, 1] + [0] * 6, [1] * 8])
    loss2, _ = policy_gradient_loss(lp2, lp2.detach(), None, torch.tensor([1.0, 1.0]), mask2, pg())
    loss2.backward()
    g = lp2.grad
    assert g[0, 0].item() == pytest.approx(g[1, 0].item()) == pytest.approx(-1 / 10)


def test_loss_is_invariant_to_repeating_the_batch():
    lp = leaf([[-1.0, -2.0], [-0.5, -3.0]])
    adv, mask = torch.tensor([1.0, -0.5]), torch.tensor([[1, 1], [1, 0]])
    one, _ = policy_gradient_loss(lp, lp.detach(), None, adv, mask, pg())
    two, _ = policy_gradient_loss(torch.cat([lp, lp]), torch.cat([lp, lp]).detach(), None,
                                  torch.cat([adv, adv]), torch.cat([mask, mask]), pg())
    assert one.item() == pytest.approx(two.item())


def test_micro_batches_with_global_token_count_match_full_batch():
    torch.manual_seed(0)
    base = -torch.rand(4, 5)
    mask = torch.tensor([[1] * 5, [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1] * 4 + [0]])
    adv = torch.tensor([1.0, -2.0, 0.5, 1.5])
    q = base - 0.1 * torch.rand(4, 5)
    ref = base + 0.1 * torch.rand(4, 5)
    cfg = pg("tis", kl_coef=0.1)
    full = base.clone().requires_grad_(True)
    policy_gradient_loss(full, q, ref, adv, mask, cfg)[0].backward()
    part = base.clone().requires_grad_(True)
    n = float(mask.sum())
    for sl in (slice(0, 2), slice(2, 4)):
        policy_gradient_loss(part[sl], q[sl], ref[sl], adv[sl], mask[sl], cfg, num_tokens=n)[0].backward()
    assert torch.allclose(full.grad, part.grad, atol=1e-7)


def test_sample_weights_scale_a_sample_without_changing_n():
    lp = leaf([[-1.0], [-1.0]])
    loss, _ = policy_gradient_loss(lp, lp.detach(), None, torch.tensor([1.0, 1.0]), torch.ones(2, 1),
                                   pg(), sample_weights=torch.tensor([1.0, 0.25]))
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-1 / 2], [-0.25 / 2]]))


def test_padding_garbage_does_not_leak():
    lp = leaf([[-1.0, float("-inf")]])
    q = torch.tensor([[-1.0, float("nan")]])
    ref = torch.tensor([[-1.0, float("nan")]])
    loss, m = policy_gradient_loss(lp, q, ref, torch.tensor([1.0]), torch.tensor([[1, 0]]), pg(kl_coef=0.1))
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(lp.grad).all()
    assert m["tokens"] == 1 and lp.grad[0, 1].item() == 0.0


def test_token_and_sequence_logprobs():
    logits = torch.tensor([[[0.0, LN(3.0)], [LN(2.0), LN(2.0)]]])  # softmax [1/4, 3/4], [1/2, 1/2]
    targets = torch.tensor([[1, 0]])
    tl = token_logprobs(logits, targets)
    assert torch.allclose(tl, torch.tensor([[LN(0.75), LN(0.5)]]))
    assert sequence_logprobs(tl, torch.tensor([[1, 0]])).item() == pytest.approx(LN(0.75))


# ---------------------------------------------------------------- advantages


def test_group_advantages_grpo_std():
    # R = [1, 0, 0, 0]: mean 0.25, unbiased std = sqrt((0.75² + 3·0.25²)/3) = 0.5
    out = compute_advantages([1, 0, 0, 0], ["g"] * 4, ["t"] * 4, {}, pg(advantage_norm="group"))
    assert torch.allclose(out.advantages, torch.tensor([1.5, -0.5, -0.5, -0.5]))
    assert out.keep.all()


def test_group_advantages_batch_rms_and_none():
    # centered = [0.75, −0.25, −0.25, −0.25]; RMS = sqrt(0.75/4) = 0.4330
    out = compute_advantages([1, 0, 0, 0], ["g"] * 4, ["t"] * 4, {}, pg(advantage_norm="batch"))
    rms = math.sqrt(0.75 / 4)
    assert torch.allclose(out.advantages, torch.tensor([0.75, -0.25, -0.25, -0.25]) / rms)
    raw = compute_advantages([1, 0, 0, 0], ["g"] * 4, ["t"] * 4, {}, pg(advantage_norm="none"))
    assert torch.allclose(raw.advantages, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_zero_variance_group_is_masked_in_drop_mode():
    out = compute_advantages([1, 1, 0, 1], ["a", "a", "b", "b"], ["t"] * 4, {},
                             pg(advantage_norm="none", uniform_groups="drop"))
    # group a is all 1: no signal; group b = [0, 1] → centered [−0.5, 0.5]
    assert out.keep.tolist() == [False, False, True, True]
    assert torch.allclose(out.advantages, torch.tensor([0.0, 0.0, -0.5, 0.5]))
    assert out.metrics["zero_var_groups"] == 1 and out.metrics["dropped_uniform"] == 2
    assert out.metrics["uniform_rebased"] == 0


def test_uniform_group_is_centred_on_leave_one_out_task_mean_by_default():
    out = compute_advantages([1, 1, 0, 1], ["a", "a", "b", "b"], ["t"] * 4, {}, pg(advantage_norm="none"))
    # group a (all 1) → b = mean of the 3 other samples of task t (grouped or not) = (1+0+1)/3;
    # A = 1 − 2/3 = 1/3. Group b keeps its own mean: [−0.5, 0.5].
    assert out.keep.all()
    assert torch.allclose(out.advantages, torch.tensor([1 / 3, 1 / 3, -0.5, 0.5]))
    assert out.metrics["zero_var_groups"] == 1 and out.metrics["uniform_rebased"] == 2
    assert out.metrics["dropped_uniform"] == 0


def test_uniform_group_uses_the_running_task_baseline_when_there_is_one():
    out = compute_advantages([-1, -1, 1, 1], ["a", "a", "b", "b"], ["t"] * 4, {"t": -0.8},
                             pg(advantage_norm="none"))
    # both groups uniform: centred on the EMA −0.8 → a: −0.2, b: +1.8
    assert torch.allclose(out.advantages, torch.tensor([-0.2, -0.2, 1.8, 1.8]))
    assert out.metrics["uniform_rebased"] == 4


def test_a_batch_of_equal_rewards_is_dropped_as_zero_advantage():
    out = compute_advantages([-1.0] * 8, ["a"] * 4 + ["b"] * 4, ["t"] * 8, {}, pg())
    # every leave-one-out mean is −1: R − b = 0 for all, nothing to learn
    assert not out.keep.any() and out.advantages.abs().max() == 0
    assert out.metrics["dropped_zero_advantage"] == 8 and out.metrics["kept"] == 0
    assert out.metrics["zero_var_groups"] == 2


def test_rare_liked_group_gets_a_large_advantage_and_is_kept():
    # 1 liked group of 4 among 25 disliked groups (100 samples), all uniform, batch-RMS scale
    rewards = [1.0] * 4 + [-1.0] * 100
    groups = [f"g{i // 4}" for i in range(104)]
    out = compute_advantages(rewards, groups, ["t"] * 104, {}, pg())
    liked, disliked = out.advantages[:4], out.advantages[4:]
    assert out.keep.all()
    assert (liked > 0).all() and (disliked < 0).all()
    assert liked.min() >= 3 * disliked.abs().max()
    assert liked.min() > 3.0  # ≈ sqrt(104 / 4) = 5.1: the rare positive is not scaled away
    dropped = compute_advantages(rewards, groups, ["t"] * 104, {}, pg(uniform_groups="drop"))
    assert not dropped.keep.any() and dropped.metrics["dropped_uniform"] == 104


@given(liked=st.integers(1, 4), disliked=st.integers(1, 60), size=st.integers(2, 6))
@settings(max_examples=40, deadline=None)
def test_uniform_groups_liked_over_disliked_advantage_is_their_count_ratio(liked, disliked, size):
    # k liked and m disliked uniform groups: b_i = (S − R_i)/(n − 1) with S = size·(k − m),
    # n = size·(k + m) gives A_liked / |A_disliked| = (n − S)/(n + S) = m / k exactly
    rewards = [1.0] * (liked * size) + [-1.0] * (disliked * size)
    groups = [i // size for i in range(len(rewards))]
    out = compute_advantages(rewards, groups, ["t"] * len(rewards), {}, pg())
    a = out.advantages.double()
    assert out.keep.all()
    assert float(a[0] / -a[-1]) == pytest.approx(disliked / liked, rel=1e-5)


def test_ungrouped_uses_task_baseline_then_ema_update():
    baselines = {"t": 0.2}
    out = compute_advantages([1.0], [None], ["t"], baselines, pg(advantage_norm="none", baseline_ema_decay=0.9))
    assert out.advantages.tolist() == pytest.approx([0.8])  # R − b computed before the update
    assert out.baselines["t"] == pytest.approx(0.9 * 0.2 + 0.1 * 1.0)
    assert baselines == {"t": 0.2}  # input not mutated


def test_new_task_uses_leave_one_out_and_lone_sample_has_no_baseline():
    out = compute_advantages([1.0, 0.0, 5.0], [None, None, None], ["new", "new", "lonely"], {},
                             pg(advantage_norm="none"))
    # "new": b_0 = R_1 = 0 → 1; b_1 = R_0 = 1 → −1. "lonely": no baseline → dropped
    assert out.keep.tolist() == [True, True, False]
    assert torch.allclose(out.advantages, torch.tensor([1.0, -1.0, 0.0]))
    assert out.metrics["dropped_no_baseline"] == 1
    assert out.baselines == {"new": 0.5, "lonely": 5.0}  # first sight: batch mean


def test_singleton_group_falls_back_to_task_baseline():
    out = compute_advantages([1.0], ["solo"], ["t"], {"t": 0.5}, pg(advantage_norm="none"))
    assert out.advantages.tolist() == pytest.approx([0.5]) and out.metrics["grouped"] == 0


def test_advantages_reject_mismatched_lengths():
    with pytest.raises(ValueError, match="one entry per sample"):
        compute_advantages([1.0, 0.0], [None], ["t", "t"], {}, pg())


# ---------------------------------------------------------------- positive behaviour cloning


def test_positive_bc_loss_hand_computed():
    lp = leaf([[-1.0, -2.0, -3.0], [-0.5, -0.25, float("nan")]])  # NaN on padding must not leak
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    positive = torch.tensor([True, False])
    loss, m = positive_bc_loss(lp, mask, positive, 0.5)
    # N = 5 (all tokens, not only the positive ones); −Σ logπ over row 0 = 6 → 0.5·6/5 = 0.6
    assert loss.item() == pytest.approx(0.6)
    loss.backward()
    expected = torch.tensor([[-0.1] * 3, [0.0, 0.0, 0.0]])  # ∂L/∂logπ = −coef/N on liked tokens only
    assert torch.allclose(lp.grad, expected)
    assert m["bc_tokens"] == 3 and m["bc_samples"] == 1 and m["bc_nll"] == pytest.approx(2.0)


def test_positive_bc_loss_uses_the_step_token_count_and_sample_weights():
    lp = leaf([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, _ = positive_bc_loss(lp, mask, torch.tensor([True, True]), 1.0,
                               sample_weights=torch.tensor([0.5, 1.0]), num_tokens=10)
    # (0.5·6 + 1·0.75) / 10 = 0.375
    assert loss.item() == pytest.approx(0.375)
    none, m = positive_bc_loss(lp, mask, torch.tensor([False, False]), 1.0)
    assert none.item() == 0.0 and m["bc_tokens"] == 0


# ---------------------------------------------------------------- KTO


def test_kto_hand_computed():
    # r = policy − ref = [2, −1]; z0 = max(0, mean r) = 0.5; β = 0.1
    # desirable: v = σ(0.1·1.5); undesirable: v = σ(0.1·(0.5 + 1)) = σ(0.15) as well
    pol, ref = leaf([-1.0, -4.0]), torch.tensor([-3.0, -3.0])
    cfg = KTOObjective(beta=0.1, desirable_weight=1.0, undesirable_weight=2.0)
    loss, m = kto_loss(pol, ref, torch.tensor([True, False]), cfg)
    s = 1 / (1 + math.exp(-0.15))
    assert loss.item() == pytest.approx((1 * (1 - s) + 2 * (1 - s)) / 2, rel=1e-6)
    assert m["kl"] == pytest.approx(0.5)
    loss.backward()
    # z0 detached: ∂/∂r_0 of (1−σ(β(r−z0)))/B = −β·s(1−s)/2;  for the undesirable one +2β·s(1−s)/2
    assert pol.grad.tolist() == pytest.approx([-0.1 * s * (1 - s) / 2, 2 * 0.1 * s * (1 - s) / 2], rel=1e-5)


def test_kto_z0_is_clamped_at_zero():
    pol, ref = leaf([-5.0]), torch.tensor([-3.0])  # r = −2 → mean < 0 → z0 = 0
    loss, m = kto_loss(pol, ref, torch.tensor([True]), KTOObjective(beta=1.0))
    assert m["kl"] == 0.0
    assert loss.item() == pytest.approx(1 - 1 / (1 + math.exp(2.0)), rel=1e-6)


def test_kto_uses_mismatched_kl_pairs_when_given():
    pol, ref = leaf([0.0]), torch.tensor([0.0])
    _, m = kto_loss(pol, ref, torch.tensor([True]), KTOObjective(),
                    kl_policy_logps=torch.tensor([1.0, 3.0]), kl_ref_logps=torch.tensor([0.0, 0.0]))
    assert m["kl"] == pytest.approx(2.0)
