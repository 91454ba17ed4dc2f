"""The learner step on the tiny Llama: LoRA-only updates, determinism, a real learning signal."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from pipelines.models.registry import base_model_hash  # noqa: E402
from pipelines.models.tiny import make_tiny_llama  # noqa: E402
from pipelines.train.batch import TrainTurn, collate, encode_turns  # noqa: E402
from pipelines.config.train import (  # noqa: E402
    KTOObjective,
    OptimizerSettings,
    PolicyGradientObjective,
    StalenessSettings,
    TrainConfig,
)
from pipelines.train.losses import token_logprobs  # noqa: E402
from pipelines.train.step import build_policy, train_step  # noqa: E402

MESSAGES = [[{"role": "user", "content": "Is the sky blue?"}],
            [{"role": "user", "content": "What is 2 plus 2?"}]]
GOOD, BAD = " Yes, it is.", " banana banana banana"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny", seed=0, warmup_steps=0)


@pytest.fixture(scope="module")
def tok(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


def _cfg(objective=None, steps=2, lr=1e-3, **staleness) -> TrainConfig:
    return TrainConfig(base_model="tiny", lora=dataclasses.replace(TrainConfig().lora, r=8, alpha=16),
                       objective=objective or PolicyGradientObjective(),
                       optimizer=OptimizerSettings(lr=lr, steps_per_iteration=steps, micro_batch_size=4),
                       staleness=StalenessSettings(**staleness))


def _seq_logprob(tiny, adapter, prompt_ids, output_ids) -> float:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])
    return float(lp[0, len(prompt_ids) - 1:].sum())


def _behaviour(tiny, prompt_ids, output_ids) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])
    return lp[0, len(prompt_ids) - 1:].tolist()


def _turns(tok, with_behaviour=None, rewards=(1.0, 0.0), tiny=None, version=None) -> list[TrainTurn]:
    """Two prompts x (GOOD, BAD) replies, each prompt one group."""
    turns = []
    for p, msgs in enumerate(MESSAGES):
        prompt = tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"]
        for text, reward in zip((GOOD, BAD), rewards):
            out = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            beh = _behaviour(tiny, prompt, out) if with_behaviour else None
            turns.append(TrainTurn(f"p{p}-{reward}", "qa", prompt, msgs, out, text, beh, reward,
                                   group_id=f"p{p}", adapter_version=version))
    return turns


def _lora_state(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def test_step_changes_every_lora_parameter_and_never_the_base(tiny, tok, tmp_path):
    from peft import get_peft_model_state_dict

    cfg = _cfg(steps=2)
    model, _ = build_policy(tiny, None, cfg, seed=3)
    before = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    assert all(("lora_" in n) == p.requires_grad for n, p in model.named_parameters())
    base_hash = base_model_hash(tiny)

    res = train_step(tiny, None, _turns(tok), cfg, tmp_path / "a1", seed=3)
    after = _lora_state(res.adapter_dir)
    assert set(after) == set(before) and len(after) == 2 * 2 * 4  # A, B x 2 layers x q/k/v/o
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, f"LoRA parameters not updated: {unchanged}"
    assert res.summary["base_unchanged"] is True and base_model_hash(tiny) == base_hash
    assert len(res.steps) == 2 and all(s["grad_norm"] > 0 for s in res.steps)
    for key in ("loss", "reward_mean", "adv_mean", "ratio_mean", "clip_frac", "kl", "grad_norm",
                "tokens_per_s", "peak_rss_mb"):
        assert key in res.steps[0]
    assert not list(tmp_path.glob(".tmp-*"))  # atomic save left no temp folder


def test_same_seed_same_adapter(tiny, tok, tmp_path):
    cfg, turns = _cfg(steps=2), _turns(tok)
    a = _lora_state(train_step(tiny, None, turns, cfg, tmp_path / "a", seed=7).adapter_dir)
    b = _lora_state(train_step(tiny, None, turns, cfg, tmp_path / "b", seed=7).adapter_dir)
    c = _lora_state(train_step(tiny, None, turns, cfg, tmp_path / "c", seed=8).adapter_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_rewarded_output_becomes_more_likely_and_chains_from_parent(tiny, tok, tmp_path):
    turns = _turns(tok, with_behaviour=True, tiny=tiny)
    prompt, good, bad = turns[0].prompt_token_ids, turns[0].output_token_ids, turns[1].output_token_ids
    cfg = _cfg(steps=4, lr=2e-3)
    r1 = train_step(tiny, None, turns, cfg, tmp_path / "v1", seed=0)
    # on-policy data from the base + a zero-initialised LoRA: the first step sees ρ ≈ 1
    assert abs(r1.steps[0]["ratio_mean"] - 1.0) < 1e-4 and r1.steps[0]["missing_behaviour"] == 0
    assert r1.steps[-1]["kl"] > 0
    r2 = train_step(tiny, r1.adapter_dir, _turns(tok, tiny=tiny, version=1), cfg, tmp_path / "v2", seed=1,
                    current_version=1, task_baselines=r1.task_baselines)
    base_good, base_bad = _seq_logprob(tiny, None, prompt, good), _seq_logprob(tiny, None, prompt, bad)
    v1_good = _seq_logprob(tiny, r1.adapter_dir, prompt, good)
    v2_good, v2_bad = _seq_logprob(tiny, r2.adapter_dir, prompt, good), _seq_logprob(tiny, r2.adapter_dir, prompt, bad)
    assert v1_good > base_good + 0.1, (base_good, v1_good)
    assert v2_good > v1_good, (v1_good, v2_good)
    assert v2_bad < base_bad, (base_bad, v2_bad)


def test_kto_objective_runs_and_drops_neutral_turns(tiny, tok, tmp_path):
    turns = _turns(tok, rewards=(1.0, -1.0)) + _turns(tok, rewards=(0.0, 0.0))
    res = train_step(tiny, None, turns, _cfg(objective=KTOObjective(beta=0.1), steps=2), tmp_path / "k", seed=0)
    assert res.summary["neutral_dropped"] == 4 and res.summary["trained_samples"] == 4
    assert len(res.steps) == 2 and all(torch.isfinite(torch.tensor(s["loss"])) for s in res.steps)
    assert (res.adapter_dir / "adapter_model.safetensors").is_file()


def test_missing_behaviour_and_retokenized_turns_are_counted(tiny, tok, tmp_path):
    turns = _turns(tok, with_behaviour=True, tiny=tiny)
    turns[1] = dataclasses.replace(turns[1], behaviour_logprobs=None)
    turns[2] = dataclasses.replace(turns[2], prompt_token_ids=None, output_token_ids=None, behaviour_logprobs=None)
    res = train_step(tiny, None, turns, _cfg(steps=1), tmp_path / "m", seed=0)
    assert res.summary["missing_behaviour"] == 2
    assert res.summary["retokenized_prompts"] == 1 and res.summary["retokenized_outputs"] == 1
    assert res.steps[0]["missing_behaviour"] == 2
    # ids re-derived from messages/text match what was served (the EOS aside)
    enc, _ = encode_turns([turns[2]], tok)
    assert enc[0].prompt_ids == _turns(tok)[2].prompt_token_ids
    assert enc[0].output_ids == _turns(tok)[2].output_token_ids[:-1]


def test_stale_turns_are_dropped_or_downweighted(tiny, tok, tmp_path):
    old = _turns(tok, version=1)
    res = train_step(tiny, None, old, _cfg(steps=1, max_versions_behind=2, mode="drop"), tmp_path / "d", seed=0,
                     current_version=5)
    assert res.summary["stale_dropped"] == 4 and res.steps == []
    res = train_step(tiny, None, old, _cfg(steps=1, max_versions_behind=2, mode="downweight"), tmp_path / "w",
                     seed=0, current_version=5)
    assert res.summary["stale_downweighted"] == 4 and len(res.steps) == 1
    with pytest.raises(ValueError, match="newer adapter"):
        train_step(tiny, None, old, _cfg(steps=1), tmp_path / "n", seed=0, current_version=0)
    for bad in ("v1", 0, 1.0):  # the version is the lake's int; a folder name is a caller's bug, said so
        with pytest.raises(ValueError, match="adapter_version=.* must be an int >= 1"):
            train_step(tiny, None, _turns(tok, version=bad), _cfg(steps=1), tmp_path / "b", seed=0)


def test_collate_masks_come_from_lengths_not_pad_ids(tok):
    eos = tok.eos_token_id
    turns = [TrainTurn("a", "t", [5, 6, 7], None, [8, eos], "", [-1.0, -2.0], 1.0),
             TrainTurn("b", "t", [5], None, [eos, eos, eos], "", None, 0.0)]
    enc, counts = encode_turns(turns, tok)
    batch = collate(enc, pad_token_id=eos)  # SmolLM2-style: pad == EOS
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, eos], [5, eos, eos, eos, eos]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0]]
    assert batch.behaviour_logprobs[0].tolist() == [0, 0, 0, -1.0, -2.0]
    assert batch.has_behaviour.tolist() == [True, False] and counts["missing_behaviour"] == 1
    with pytest.raises(ValueError, match="misaligned"):
        encode_turns([dataclasses.replace(turns[0], behaviour_logprobs=[-1.0])], tok)



def test_lm_head_on_scored_rows_only_matches_full_logits(tiny, tok):
    """output_logprobs' fast path (LM head on the output positions only) gives the full-logits
    path's token logprobs, PG + KL loss, KTO loss and LoRA gradients, policy and reference alike."""
    from pipelines.train.losses import kto_loss, policy_gradient_loss, sequence_logprobs
    from pipelines.train.step import _decoder_and_head, output_logprobs

    model, _ = build_policy(tiny, None, _cfg(), seed=0)
    assert _decoder_and_head(model) is not None  # the tiny Llama takes the fast path
    with torch.no_grad():  # non-zero LoRA B: policy != reference, LoRA A gets gradients too
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    enc, _ = encode_turns(_turns(tok), tok)  # uneven prompt and output lengths: real padding
    batch = collate(enc, tok.pad_token_id)
    ids, att, mask = batch.input_ids, batch.attention_mask, batch.loss_mask[:, 1:]
    assert (mask == 0).any() and att.min() == 0
    params = [p for p in model.parameters() if p.requires_grad]

    def run(fast):
        model.zero_grad(set_to_none=True)
        lp = output_logprobs(model, ids, att, batch.loss_mask, head_only_where_scored=fast)
        with torch.no_grad(), model.disable_adapter():
            ref = output_logprobs(model, ids, att, batch.loss_mask, head_only_where_scored=fast)
        pg, _ = policy_gradient_loss(lp, lp.detach() + 0.1, ref, torch.tensor([1.0, -1.0, 0.5, -0.5]), mask,
                                     PolicyGradientObjective(correction="tis", tis_cap=1.05, kl_coef=0.1))
        kto, _ = kto_loss(sequence_logprobs(lp, mask), sequence_logprobs(ref, mask),
                          torch.tensor([True, False, True, False]), KTOObjective(beta=0.1))
        (pg + kto).backward()
        return lp.detach(), ref, pg.detach(), kto.detach(), [p.grad.clone() for p in params]

    fast, full = run(True), run(False)
    # the full path is the learner's former code: token_logprobs over model(...).logits
    with torch.no_grad():
        old = token_logprobs(model(input_ids=ids, attention_mask=att).logits[:, :-1], ids[:, 1:])
        with model.disable_adapter():
            old_ref = token_logprobs(model(input_ids=ids, attention_mask=att).logits[:, :-1], ids[:, 1:])
    assert torch.equal(full[0], old * mask) and torch.equal(full[1], old_ref * mask)
    assert not torch.allclose(fast[0], fast[1])  # the policy differs from the reference here
    assert bool((fast[0][mask == 0] == 0).all()) and bool((fast[0][mask > 0] < 0).all())
    for a, b in zip(fast[:4], full[:4]):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()
    assert len(fast[4]) == len(full[4]) == 2 * 2 * 4 and all(g.abs().max() > 0 for g in fast[4])
    for a, b in zip(fast[4], full[4]):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4), (a - b).abs().max()


def test_shared_prompt_prefix_runs_once_with_the_same_logprobs_and_gradients(tiny, tok, tmp_path):
    """Rows that start alike (one system prompt; one group's prompt with replies that start alike)
    compute that prefix once as a KV cache; logprobs and LoRA gradients match the per-row pass."""
    from pipelines.train.step import output_logprobs, shared_prefix_len

    model, _ = build_policy(tiny, None, _cfg(), seed=0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    system = {"role": "system", "content": "You are the support assistant of Acme; answer in one short sentence."}
    replies = [("Where is my order?", " It ships today."), ("Where is my order?", " It ships tomorrow, sorry."),
               ("Can I get a refund?", " Yes, within 30 days.")]
    turns = []
    for i, (question, reply) in enumerate(replies):
        msgs = [system, {"role": "user", "content": question}]
        prompt = tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"]
        out = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        turns.append(TrainTurn(f"t{i}", "qa", prompt, msgs, out, reply, None, (1.0, -1.0, 1.0)[i], group_id=question))
    enc, _ = encode_turns(turns, tok)
    params = [p for p in model.parameters() if p.requires_grad]

    def run(items, share):
        batch = collate(items, tok.pad_token_id)
        model.zero_grad(set_to_none=True)
        lp = output_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask,
                             prefix=None if share else 0)
        with torch.no_grad(), model.disable_adapter():
            ref = output_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask,
                                  prefix=None if share else 0)
        (lp * torch.arange(1.0, lp.shape[1] + 1)).sum().backward()  # position-dependent: misplaced rows show
        return batch, lp.detach(), ref, [p.grad.clone() for p in params]

    # the group's two rows share their whole prompt and the first reply token: the prefix stops
    # at the position whose hidden state scores the first reply token
    same_prompt = collate(enc[:2], tok.pad_token_id)
    first_scored = len(enc[0].prompt_ids) - 1
    assert shared_prefix_len(same_prompt.input_ids, same_prompt.attention_mask, same_prompt.loss_mask) == first_scored
    for items in (enc[:2], enc):
        batch, *shared = run(items, True)
        _, *per_row = run(items, False)
        assert shared_prefix_len(batch.input_ids, batch.attention_mask, batch.loss_mask) >= 8
        assert torch.equal(shared[0] == 0, batch.loss_mask[:, 1:] == 0)
        for a, b in zip(shared[:2], per_row[:2]):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()
        assert all(g.abs().max() > 0 for g in shared[2])
        for a, b in zip(shared[2], per_row[2]):  # float rounding, relative to the gradient's scale
            assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max()), (a - b).abs().max()
    # nothing to share: one row, or rows that differ from the first token
    one = collate(enc[:1], tok.pad_token_id)
    assert shared_prefix_len(one.input_ids, one.attention_mask, one.loss_mask) == 0
    apart = collate(enc, tok.pad_token_id)
    apart.input_ids[1, 0] += 1
    assert shared_prefix_len(apart.input_ids, apart.attention_mask, apart.loss_mask) == 0
    # the learner reports how much it reused (all three turns in one micro-batch)
    res = train_step(tiny, None, turns, _cfg(KTOObjective(), steps=1), tmp_path / "a", seed=0)
    batch = collate(enc, tok.pad_token_id)
    want = 2 * shared_prefix_len(batch.input_ids, batch.attention_mask, batch.loss_mask) / batch.input_ids.numel()
    assert res.steps[0]["prefix_reuse_frac"] == pytest.approx(want) and want > 0.1


def _uniform_turns(tok, liked=(1.0, 1.0), disliked=(-1.0, -1.0)) -> list[TrainTurn]:
    """Group p0 all liked, group p1 all disliked: no signal under either group's own mean."""
    return _turns(tok, rewards=liked)[:2] + _turns(tok, rewards=disliked)[2:]


def test_uniform_groups_train_on_the_task_baseline_and_the_summary_says_why(tiny, tok, tmp_path, capsys):
    turns = _uniform_turns(tok)
    prompt, good = turns[0].prompt_token_ids, turns[0].output_token_ids
    drop = train_step(tiny, None, turns, _cfg(PolicyGradientObjective(uniform_groups="drop"), steps=2),
                      tmp_path / "drop", seed=0)
    assert drop.steps == [] and drop.summary["trained_samples"] == 0
    assert drop.summary["zero_var_groups"] == 2 and drop.summary["dropped_uniform"] == 4

    res = train_step(tiny, None, turns, _cfg(steps=4, lr=2e-3), tmp_path / "tb", seed=0)
    assert res.summary["trained_samples"] == 4 and res.summary["uniform_rebased"] == 4
    assert res.summary["zero_var_groups"] == 2 and res.summary["dropped_uniform"] == 0
    assert "uniform_rebased=4" in capsys.readouterr().out
    # the all-liked group's reply became more likely than under the base
    assert _seq_logprob(tiny, res.adapter_dir, prompt, good) > _seq_logprob(tiny, None, prompt, good) + 0.1

    same = train_step(tiny, None, _uniform_turns(tok, liked=(-1.0, -1.0)), _cfg(steps=1), tmp_path / "eq", seed=0)
    assert same.summary["dropped_zero_advantage"] == 4 and same.steps == []


def test_positive_bc_term_trains_liked_turns_the_advantage_dropped(tiny, tok, tmp_path):
    turns = _uniform_turns(tok)
    prompt, good = turns[0].prompt_token_ids, turns[0].output_token_ids
    obj = PolicyGradientObjective(uniform_groups="drop", positive_bc_coef=1.0)
    res = train_step(tiny, None, turns, _cfg(obj, steps=4, lr=2e-3), tmp_path / "bc", seed=0)
    assert res.summary["bc_samples"] == 2 and res.summary["bc_only"] == 2 and res.summary["trained_samples"] == 2
    assert all(s["bc_loss"] > 0 for s in res.steps) and len(res.steps) == 4
    assert sorted(res.turn_ids) == sorted(t.turn_id for t in turns[:2])  # the disliked ones never trained
    assert _seq_logprob(tiny, res.adapter_dir, prompt, good) > _seq_logprob(tiny, None, prompt, good) + 0.1


def test_turn_weight_scales_the_loss_and_counts_as_replayed(tiny, tok, tmp_path):
    turns = _turns(tok, with_behaviour=True, tiny=tiny)
    full = train_step(tiny, None, turns, _cfg(steps=1), tmp_path / "full", seed=0)
    half = train_step(tiny, None, [dataclasses.replace(t, weight=0.5) for t in turns], _cfg(steps=1),
                      tmp_path / "half", seed=0)
    # first step, before any update: every term of the loss is linear in the sample weight
    assert half.steps[0]["loss"] == pytest.approx(0.5 * full.steps[0]["loss"], rel=1e-5)
    assert half.summary["weighted"] == 4 and full.summary["weighted"] == 0
    for bad in (0.0, 1.5, float("nan")):
        broken = [turns[0], dataclasses.replace(turns[1], weight=bad)] + turns[2:]
        with pytest.raises(ValueError, match=f"turn {turns[1].turn_id!r}: weight="):
            train_step(tiny, None, broken, _cfg(steps=1), tmp_path / f"bad{bad}", seed=0)


def test_default_staleness_trains_a_long_branch(tiny, tok, tmp_path):
    # served by the champion v1 while the learner's branch is at v9 (8 ahead): full weight;
    # at v12 (11 ahead) down-weighted to 0.5, never dropped
    old = _turns(tok, version=1)
    near = train_step(tiny, None, old, _cfg(steps=1), tmp_path / "near", seed=0, current_version=9)
    assert near.summary["stale_dropped"] == 0 and near.summary["stale_downweighted"] == 0
    far = train_step(tiny, None, old, _cfg(steps=1), tmp_path / "far", seed=0, current_version=12)
    assert far.summary["stale_dropped"] == 0 and far.summary["stale_downweighted"] == 4
    assert far.steps[0]["loss"] == pytest.approx(0.5 * near.steps[0]["loss"], rel=1e-5)


def test_micro_batches_of_mixed_lengths_are_cut_with_little_padding(tiny, tmp_path):
    """Short one-turn prompts and long multi-turn ones, interleaved as the lake returns them: the
    learner cuts micro-batches of similar lengths, so few positions are padding (by prompt order,
    each micro-batch would pad every short row to a long one: half the positions)."""
    rng = __import__("random").Random(0)
    turns = [TrainTurn(turn_id=f"t{i}", task="t", prompt_token_ids=[1] + [rng.randrange(3, 200) for _ in
                                                                            range(4 if i % 2 else 60)],
                       input_messages=None, output_token_ids=[rng.randrange(3, 200) for _ in range(6)],
                       output_text="", behaviour_logprobs=None, reward=float(i % 3 - 1), group_id=None)
             for i in range(16)]
    cfg = _cfg(steps=1)
    cfg = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, micro_batch_size=4))
    res = train_step(tiny, None, turns, cfg, tmp_path / "a", seed=0)
    assert res.steps[0]["samples"] == 16 and res.steps[0]["pad_frac"] < 0.1, res.steps[0]["pad_frac"]
