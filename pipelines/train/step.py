"""One learner iteration: base + LoRA, a batch of rewarded turns, a few AdamW steps, a new adapter.

Reads top to bottom like nanoGPT's loop. Phases, in order:
  1. load the base (fp32) and wrap it with LoRA: fresh from the config, or the parent adapter
     loaded trainable; move it to ``train.device`` (forwards in ``train.precision`` autocast,
     logprobs and loss in fp32: pipelines/train/device.py);
  2. encode turns; staleness weights (drop / down-weight turns served by old adapters) times each
     turn's own replay weight;
  3. advantages (policy gradient) or desirable labels (KTO); drop samples with no signal;
  4. ``steps_per_iteration`` optimizer steps, each over its slice of the batch, in micro-batches:
     reference logprobs (read from the lake when a turn's are kept there, else from the SAME model
     with adapters disabled, no grad, and returned to be kept), then the policy forward -> token
     logprobs; loss from the pure functions in ``losses``; backward;
     then clip, AdamW step, log. Both forwards apply the LM head only at the positions whose
     next token is an output token (:func:`output_logprobs`): the loss never reads the others.
     Micro-batches are cut from the step's turns sorted by length (least padding), and the tokens
     all rows of a micro-batch start with (a system prompt, a group's prompt) run once, as a
     KV-cache prefix;
  5. save the adapter (safetensors) to ``out_dir`` atomically.

The base weights are frozen (peft) and fingerprinted before and after: a change raises.
Same inputs + seed on one machine -> bit-identical adapter.
"""

from __future__ import annotations

import math
import resource
from collections import ChainMap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable, Mapping, Sequence

from pipelines.adapters.store import write_folder_atomically
from pipelines.adapters.version import parse_version
from pipelines.lake.reference import Reference, ids_digest
from pipelines.train.batch import EncodedTurn, TrainTurn, collate, encode_turns
from pipelines.train.device import place
from pipelines.config.train import KTOObjective, TrainConfig
from pipelines.train.optim_state import OPTIMIZER_FILE, load_optimizer_state, save_optimizer_state


@dataclass
class StepResult:
    adapter_dir: Path
    steps: list[dict[str, float]]  # one dict per optimizer step
    summary: dict[str, Any]  # data counts, timings, final metrics
    task_baselines: dict[Hashable, float] = field(default_factory=dict)  # feed to the next call
    turn_ids: list[str] = field(default_factory=list)  # the turns that carried signal
    reference: dict[str, Reference] = field(default_factory=dict)  # computed here, to keep (lake/reference.py)
    precision: str = "fp32"  # the forwards' precision: part of a kept reference's key


def build_policy(base_model_path: Path, parent_adapter_dir: Path | None, cfg: TrainConfig, seed: int):
    """(peft model in train mode with only LoRA trainable, tokenizer). LoRA init uses ``seed``."""
    import torch
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_path)
    base = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=torch.float32)
    if parent_adapter_dir is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = get_peft_model(base, cfg.lora.to_peft())
    else:
        model = PeftModel.from_pretrained(base, parent_adapter_dir, is_trainable=True)
        pc = model.peft_config["default"]
        got = (pc.r, pc.lora_alpha, sorted(pc.target_modules))
        want = (cfg.lora.r, cfg.lora.alpha, sorted(cfg.lora.target_modules))
        if got != want:
            raise ValueError(f"parent adapter {parent_adapter_dir} has (r, alpha, targets)={got} but "
                             f"cfg.lora asks {want}; a lineage keeps one shape: match cfg.lora to the parent")
    model.train()
    return model, tokenizer


def micro_batch_key(e: EncodedTurn) -> tuple[int, list[int]]:
    """Order of a step's turns before micro-batches are cut: by length, then prompt. Rows are
    right-padded to the longest, so mixing a 3-turn session's prompt with 1-turn ones ran ~1.5x
    the positions (measured on the loop's sessions); by length, the rows still share ~95% of the
    prefix the prompt order shared (mostly the chat template's system prompt)."""
    return len(e.prompt_ids) + len(e.output_ids), e.prompt_ids


def _decoder_and_head(model):
    """(decoder, lm_head) of a causal LM whose logits are exactly ``lm_head(decoder(...).last_hidden_state)``
    (Llama, Qwen2, Mistral, SmolLM2, the tiny test model); None for any other layout, or for a model
    that post-processes its logits (soft-capping, scaling), which then takes the full-logits path.
    On a PeftModel both come from the wrapped model: the LoRA layers inside stay active, and
    ``disable_adapter()`` still turns them off."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = getattr(base, "model", None), getattr(base, "lm_head", None)
    if decoder is None or head is None or head is not base.get_output_embeddings():
        return None
    cfg = base.config
    if any(getattr(cfg, k, None) not in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        return None
    return decoder, head


MIN_SHARED_PREFIX = 8  # below this, the extra decoder call costs more than the rows it saves


def shared_prefix_len(input_ids, attention_mask, loss_mask) -> int:
    """How many leading tokens every row of the batch shares and can compute once: the common
    prefix, stopped one short of the first scored position (the suffix pass must produce the hidden
    state that scores it) and inside every row's attention. 0 when that is under ``MIN_SHARED_PREFIX``
    or there is one row."""
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(0)
    if attention_mask is not None:
        same &= (attention_mask > 0).all(0)
    common = int(same.int().cumprod(0).sum())
    scored = loss_mask[:, 1:] > 0  # column t-1 scores token t
    if not bool(scored.any(1).all()):
        return 0
    first_scored_row = int(scored.int().argmax(1).min())  # hidden state at this position is read
    n = min(common, first_scored_row)
    return n if n >= MIN_SHARED_PREFIX else 0


def _decode(decoder, input_ids, attention_mask, prefix: int):
    """Hidden states of positions ``prefix:``; positions ``:prefix`` (equal in every row) run once
    for one row, and the rows attend to that KV cache. Same numbers as one pass over all rows,
    up to float rounding; gradients flow through the shared cache into the LoRA weights."""
    if prefix == 0:
        return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    cache = decoder(input_ids=input_ids[:1, :prefix], use_cache=True).past_key_values
    cache.batch_repeat_interleave(input_ids.shape[0])
    return decoder(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, past_key_values=cache,
                   use_cache=True).last_hidden_state


def output_logprobs(model, input_ids, attention_mask, loss_mask, *, head_only_where_scored: bool = True,
                    prefix: int | None = None):
    """log π(input_ids[:, t] | input_ids[:, <t]) for t ≥ 1: ``[B, T-1]``, aligned with ``loss_mask[:, 1:]``,
    in fp32, and 0 where ``loss_mask[:, 1:]`` is 0 (prompt, padding).

    The LM head (vocab x hidden: 49152 x 576 on SmolLM2, ~20% of a forward) and the logsumexp run only
    on the rows t−1 whose next token is an output token, in fp32 under any autocast (:func:`fp32_logprobs`); the prompt rows' logits were computed and
    thrown away before. Same numbers as ``token_logprobs(model(...).logits[:, :-1], input_ids[:, 1:])``
    at the scored positions, up to float rounding (tests/train/test_step.py checks values and
    gradients). ``head_only_where_scored=False`` (or a model :func:`_decoder_and_head` does not
    recognise) takes that full-logits path. ``prefix``: that many leading tokens, common to all
    rows, run once, not once per row (None: :func:`shared_prefix_len`; 0: no sharing); production
    turns of one app share its system prompt, and a group's samples share their whole prompt.
    """
    import torch

    from pipelines.train.losses import token_logprobs

    targets, scored = input_ids[:, 1:], loss_mask[:, 1:] > 0
    parts = _decoder_and_head(model) if head_only_where_scored else None
    if parts is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        lp = token_logprobs(logits[:, :-1], targets)
        return torch.where(scored, lp, torch.zeros((), dtype=lp.dtype))
    decoder, head = parts
    if prefix is None:
        prefix = shared_prefix_len(input_ids, attention_mask, loss_mask)
    hidden = _decode(decoder, input_ids, attention_mask, prefix)  # positions prefix..T-1
    rows, cols = scored.nonzero(as_tuple=True)
    picked = fp32_logprobs(head, hidden[rows, cols - prefix], targets[rows, cols])  # [N]: N scored tokens
    return picked.new_zeros(scored.shape).index_put((rows, cols), picked)


def usable_reference(e: EncodedTurn, reference: Mapping[str, Reference] | None) -> Reference | None:
    """The turn's kept reference if it was computed on exactly these ids, else None."""
    r = (reference or {}).get(e.turn.turn_id)
    if r is None or len(r.logprobs) != len(e.output_ids) or r.ids_digest != ids_digest(e.prompt_ids, e.output_ids):
        return None
    return r


def reference_tensor(refs: Sequence[Reference], loss_mask):
    """Kept references as ``output_logprobs`` returns them: ``[B, T-1]``, each row's values at its
    output positions in order, 0 elsewhere."""
    import torch

    scored = loss_mask[:, 1:] > 0
    rows, cols = scored.nonzero(as_tuple=True)  # row-major: a row's output positions in order
    values = torch.tensor([x for r in refs for x in r.logprobs], dtype=torch.float32, device=loss_mask.device)
    return torch.zeros(scored.shape, dtype=torch.float32, device=loss_mask.device).index_put((rows, cols), values)


def reference_rows(ref_lp, loss_mask) -> list[list[float]]:
    """Each row's reference logprobs at its output positions (the inverse of :func:`reference_tensor`)."""
    scored = (loss_mask[:, 1:] > 0).cpu()
    lp = ref_lp.detach().float().cpu()
    return [lp[b][scored[b]].tolist() for b in range(lp.shape[0])]


def fp32_logprobs(head, hidden, targets):
    """The LM head and log-softmax in fp32 even inside a bf16 autocast (device.py says why)."""
    import torch

    from pipelines.train.losses import token_logprobs

    with torch.autocast(device_type=hidden.device.type, enabled=False):
        return token_logprobs(head(hidden.float()), targets)


def _base_fingerprint(model) -> list[float]:
    import torch

    with torch.no_grad():
        return [float(p.double().sum()) for n, p in model.named_parameters() if not p.requires_grad]


def _parent_version(parent_adapter_dir: Path | None) -> int:
    if parent_adapter_dir is None:
        return 0
    meta = Path(parent_adapter_dir) / "tracerl.json"
    if meta.is_file():
        import json

        return int(json.loads(meta.read_text())["version"])
    v = parse_version(Path(parent_adapter_dir).name)
    if v is None:
        raise ValueError(f"cannot tell the version of parent adapter {parent_adapter_dir}: no tracerl.json "
                         f"and the folder is not named v<N>; pass current_version=")
    return v


def _slices(n: int, steps: int, gen) -> list[list[int]]:
    """A seeded permutation split into ``steps`` slices; with fewer samples than steps, every
    step sees the whole batch (several epochs of a small batch)."""
    import torch

    perm = torch.randperm(n, generator=gen)
    if n >= steps:
        return [s.tolist() for s in torch.tensor_split(perm, steps)]
    return [perm.tolist() for _ in range(steps)]


def train_step(
    base_model_path: Path,
    parent_adapter_dir: Path | None,
    turns: Sequence[TrainTurn],
    cfg: TrainConfig,
    out_dir: Path,
    seed: int,
    *,
    current_version: int | None = None,
    task_baselines: dict[Hashable, float] | None = None,
    optimizer_state: Path | None = None,
    reference: Mapping[str, Reference] | None = None,
) -> StepResult:
    """Train the adapter on ``turns`` and save it to ``out_dir`` (must not exist).

    ``current_version``: the version being trained from (staleness is measured against it);
    default: the parent's ``tracerl.json`` version or its ``v<N>`` folder name, 0 without one.
    ``task_baselines``: running per-task reward baselines from the previous call.
    ``optimizer_state``: the parent's ``optimizer.safetensors`` (AdamW moments and step count) to
    continue from; None starts a fresh AdamW. Saved again beside the new adapter either way.
    ``reference``: kept reference logprobs by turn id, computed on this base in this precision
    (``read_reference``); a turn's are used when its ids' digest and length match, so a micro-batch
    whose every row has them skips the reference forward. The ones computed here are returned in
    ``StepResult.reference``.
    """
    import torch

    from pipelines.train.losses import (
        compute_advantages, kto_loss, policy_gradient_loss, positive_bc_loss, sequence_logprobs)

    t_start = time.perf_counter()
    obj, opt_cfg = cfg.objective, cfg.optimizer
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"out_dir {out_dir} exists; each step writes a new adapter folder")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)

        # 1. base + LoRA, on the configured device ---------------------------------------
        placement = place(cfg)
        model, tokenizer = build_policy(Path(base_model_path), parent_adapter_dir, cfg, seed)
        model.to(placement.device)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        fingerprint = _base_fingerprint(model)
        params = [p for p in model.parameters() if p.requires_grad]
        n_trainable = sum(p.numel() for p in params)
        current = current_version if current_version is not None else _parent_version(parent_adapter_dir)

        # 2. encode + staleness (x the turn's own replay weight) -------------------------
        for t in turns:
            if not (math.isfinite(t.weight) and 0.0 < t.weight <= 1.0):
                raise ValueError(f"turn {t.turn_id!r}: weight={t.weight!r} must be finite and in (0, 1]; "
                                 f"1 = fresh, < 1 = replayed (age decay); leave a turn out rather than weight it 0")
            v = t.adapter_version
            if v is not None and (type(v) is not int or v < 1):
                raise ValueError(f"turn {t.turn_id!r}: adapter_version={v!r} must be an int >= 1 (the adapter "
                                 f"version that served it) or None (the base model)")
        encoded, summary = encode_turns(turns, tokenizer)
        summary.update({"seed": float(seed), "current_version": float(current), "trainable_params": float(n_trainable),
                        "device_cuda": float(placement.device == "cuda"), "bf16": float(placement.precision == "bf16"),
                        "stale_dropped": 0.0, "stale_downweighted": 0.0, "weighted": 0.0})
        weighted: list[tuple[EncodedTurn, float]] = []
        for e in encoded:
            w = cfg.staleness.sample_weight(current - (e.turn.adapter_version or 0))  # None: the base model, 0
            if w == 0.0:
                summary["stale_dropped"] += 1
                continue
            summary["stale_downweighted"] += w < 1.0
            summary["weighted"] += e.turn.weight < 1.0  # replayed (age decay) or labelled by a learned signal
            weighted.append((e, w * e.turn.weight))

        # 3. advantages / labels ---------------------------------------------------------
        if isinstance(obj, KTOObjective):
            kept = [(e, w) for e, w in weighted if e.turn.reward != 0.0]  # KTO needs thumbs up or down
            summary["neutral_dropped"] = float(len(weighted) - len(kept))
            signal = [1.0 if e.turn.reward > 0 else 0.0 for e, _ in kept]  # desirable flag
            positive = [False] * len(kept)
            baselines = dict(task_baselines or {})
        else:
            adv = compute_advantages([e.turn.reward for e, _ in weighted], [e.turn.group_id for e, _ in weighted],
                                     [e.turn.task for e, _ in weighted], dict(task_baselines or {}), obj)
            summary.update(adv.metrics)  # reward_mean, adv_mean/std, kept, zero_var_groups, dropped_*, ...
            # a liked turn with no PG signal (e.g. a dropped uniform group) still trains through the
            # behaviour-cloning term when it is on; its advantage is 0
            bc = obj.positive_bc_coef > 0
            is_pos = [bc and e.turn.reward > obj.positive_threshold for e, _ in weighted]
            chosen = [i for i, k in enumerate(adv.keep.tolist()) if k or is_pos[i]]
            kept = [weighted[i] for i in chosen]
            signal = [float(adv.advantages[i]) if adv.keep[i] else 0.0 for i in chosen]
            positive = [is_pos[i] for i in chosen]
            baselines = adv.baselines
            summary["bc_samples"] = float(sum(positive))
            summary["bc_only"] = float(sum(1 for i in chosen if not adv.keep[i]))
            print("train_step: advantages " + " ".join(f"{k}={summary[k]:g}" for k in (
                "samples", "kept", "zero_var_groups", "uniform_rebased", "dropped_uniform", "dropped_no_baseline",
                "dropped_zero_advantage", "bc_samples", "bc_only")))
        summary["trained_samples"] = float(len(kept))
        print(f"train_step: {len(turns)} turns -> {len(kept)} with signal; version {current}; "
              f"{int(summary['weighted'])} at a weight < 1 (replayed or learned labels), {int(summary['stale_downweighted'])} down-weighted; "
              f"{n_trainable} trainable params; {opt_cfg.steps_per_iteration} steps x micro-batch {opt_cfg.micro_batch_size}; "
              f"{placement.device} {placement.precision}")

        # 4. optimizer steps ---------------------------------------------------------------
        share = _decoder_and_head(model) is not None and placement.share_prefix  # the rows' common prefix once
        optimizer = torch.optim.AdamW(params, lr=opt_cfg.lr, betas=opt_cfg.betas, weight_decay=opt_cfg.weight_decay)
        summary["optimizer_resumed_step"] = float(load_optimizer_state(optimizer, optimizer_state)
                                                  if optimizer_state is not None else 0)
        steps: list[dict[str, float]] = []
        computed: dict[str, Reference] = {}
        known = ChainMap(computed, dict(reference or {}))  # a small batch's later epochs read their own
        for step, idx in enumerate(_slices(len(kept), opt_cfg.steps_per_iteration, gen) if kept else []):
            t0 = time.perf_counter()
            # micro-batches cut in micro_batch_key order (least padding); the gradient is their sum either way
            idx = sorted(idx, key=lambda i: micro_batch_key(kept[i][0]))
            step_tokens = sum(len(kept[i][0].output_ids) for i in idx)
            acc: dict[str, float] = {"reference_read": 0.0, "loss": 0.0, "kl_tok": 0.0, "ratio_tok": 0.0, "clip_tok": 0.0,
                                     "ratio_max": -math.inf, "ratio_min": math.inf, "missing_behaviour": 0.0,
                                     "positions": 0.0, "prefix_reused": 0.0, "real_positions": 0.0}
            optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(idx), opt_cfg.micro_batch_size):
                mb = idx[start: start + opt_cfg.micro_batch_size]
                batch = collate([kept[i][0] for i in mb], pad_id).to(placement.device)
                weights = torch.tensor([kept[i][1] for i in mb], dtype=torch.float32, device=placement.device)
                sig = torch.tensor([signal[i] for i in mb], dtype=torch.float32, device=placement.device)
                mask = batch.loss_mask[:, 1:]

                # reference: same weights, adapters off, no graph. First, so its buffers are free
                # (and reused) before the policy forward holds its activations for the backward.
                # the rows' common prefix, run once in both forwards (0 on the full-logits path)
                prefix = shared_prefix_len(batch.input_ids, batch.attention_mask, batch.loss_mask) if share else 0
                rows = [kept[i][0] for i in mb]
                refs = [usable_reference(e, known) for e in rows]
                acc["reference_read"] += sum(r is not None for r in refs)
                missing = [j for j, r in enumerate(refs) if r is None]
                if missing:  # only the rows without a kept reference run the reference forward
                    sub = batch if len(missing) == len(rows) else \
                        collate([rows[j] for j in missing], pad_id).to(placement.device)
                    sub_prefix = prefix if sub is batch else (
                        shared_prefix_len(sub.input_ids, sub.attention_mask, sub.loss_mask) if share else 0)
                    with torch.no_grad(), model.disable_adapter(), placement.autocast():
                        sub_lp = output_logprobs(model, sub.input_ids, sub.attention_mask, sub.loss_mask,
                                                 prefix=sub_prefix)
                    for j, lp_row in zip(missing, reference_rows(sub_lp, sub.loss_mask)):
                        e = rows[j]
                        refs[j] = computed[e.turn.turn_id] = Reference(ids_digest(e.prompt_ids, e.output_ids), lp_row)
                ref_lp = sub_lp if len(missing) == len(rows) else reference_tensor(refs, batch.loss_mask)
                # policy forward: logits at t-1 score the token at t (LM head on scored rows only)
                with placement.autocast():
                    lp = output_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, prefix=prefix)

                if isinstance(obj, KTOObjective):
                    pol_seq, ref_seq = sequence_logprobs(lp, mask), sequence_logprobs(ref_lp, mask)
                    loss, m = kto_loss(pol_seq, ref_seq, sig > 0, obj, sample_weights=weights)
                    loss = loss * (len(mb) / len(idx))  # kto_loss averages over its micro-batch
                    # note: z₀ (the KL reference point) is estimated per micro-batch, not per step
                    ntok = float(mask.sum())
                    m = {**m, "ratio_mean": 1.0, "ratio_max": 1.0, "ratio_min": 1.0, "clip_frac": 0.0}
                else:
                    # no logged q: use the current policy itself (ρ = 1), never a made-up value
                    q = torch.where(batch.has_behaviour[:, None], batch.behaviour_logprobs[:, 1:], lp.detach())
                    loss, m = policy_gradient_loss(lp, q, ref_lp, sig, mask, obj, sample_weights=weights,
                                                   num_tokens=step_tokens)
                    pos = torch.tensor([positive[i] for i in mb], dtype=torch.bool, device=placement.device)
                    if obj.positive_bc_coef > 0 and bool(pos.any()):  # shares the PG term's k3 KL leash
                        bc_loss, bm = positive_bc_loss(lp, mask, pos, obj.positive_bc_coef, sample_weights=weights,
                                                       num_tokens=step_tokens)
                        loss = loss + bc_loss
                        acc["bc_loss"] = acc.get("bc_loss", 0.0) + bm["bc_loss"]
                    ntok = m["tokens"]
                loss.backward()
                acc["loss"] += float(loss.item())
                acc["kl_tok"] += m["kl"] * ntok
                acc["ratio_tok"] += m["ratio_mean"] * ntok
                acc["clip_tok"] += m["clip_frac"] * ntok
                acc["ratio_max"] = max(acc["ratio_max"], m["ratio_max"])
                acc["ratio_min"] = min(acc["ratio_min"], m["ratio_min"])
                acc["missing_behaviour"] += float((~batch.has_behaviour).sum())
                acc["positions"] += batch.input_ids.numel()  # what each forward would run row by row
                acc["real_positions"] += float(batch.attention_mask.sum())
                acc["prefix_reused"] += (len(mb) - 1) * prefix

            # clip, step
            clip = opt_cfg.grad_clip if opt_cfg.grad_clip > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
            optimizer.step()

            # log
            dt = time.perf_counter() - t0
            tok = max(step_tokens, 1)
            sig_t = torch.tensor([signal[i] for i in idx])
            steps.append({
                "step": float(step), "loss": acc["loss"], "samples": float(len(idx)), "tokens": float(step_tokens),
                "reward_mean": float(sum(kept[i][0].turn.reward for i in idx) / len(idx)),
                "adv_mean": float(sig_t.mean()), "adv_std": float(sig_t.std(unbiased=False)),
                "ratio_mean": acc["ratio_tok"] / tok, "ratio_max": acc["ratio_max"], "ratio_min": acc["ratio_min"],
                "clip_frac": acc["clip_tok"] / tok, "kl": acc["kl_tok"] / tok, "grad_norm": grad_norm,
                "missing_behaviour": acc["missing_behaviour"], "lr": opt_cfg.lr,
                # samples whose reference logprobs were read (kept in the lake), not recomputed
                "reference_read": acc["reference_read"], "bc_loss": acc.get("bc_loss", 0.0),
                # share of positions each forward did not recompute: the micro-batch's common prefix
                # ran once (output_logprobs); 0 on models without the decoder/head split
                "prefix_reuse_frac": acc["prefix_reused"] / max(acc["positions"], 1.0),
                # share of positions that were right-padding (micro_batch_key keeps it low)
                "pad_frac": 1.0 - acc["real_positions"] / max(acc["positions"], 1.0),
                "tokens_per_s": step_tokens / dt if dt > 0 else math.nan, "step_s": dt,
                # process high-water mark so far (ru_maxrss is KiB on Linux)
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            })
            print(" ".join(f"{k}={v:.4g}" for k, v in steps[-1].items()))

        if _base_fingerprint(model) != fingerprint:
            raise RuntimeError("base weights changed during train_step; only LoRA parameters may train")

        # 5. save --------------------------------------------------------------------------
        def save(tmp: Path) -> None:
            model.save_pretrained(tmp, safe_serialization=True)
            save_optimizer_state(optimizer, tmp / OPTIMIZER_FILE)  # the branch's next step continues from it

        write_folder_atomically(out_dir, save)

    summary.update({"optimizer_steps": float(len(steps)), "base_unchanged": True,
                    "wall_s": time.perf_counter() - t_start,
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0})
    if steps:
        summary.update({f"final_{k}": steps[-1][k] for k in ("loss", "kl", "ratio_mean", "grad_norm")})
    summary["reference_computed"] = float(len(computed))
    return StepResult(out_dir, steps, summary, baselines, [e.turn.turn_id for e, _ in kept], computed,
                      placement.precision)
