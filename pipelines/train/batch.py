"""Training records and their padded tensors.

A :class:`TrainTurn` is one served reply with its reward, as the lake hands it to the learner.
:func:`encode_turns` turns records into token ids (re-tokenizing only what the lake lacks, and
counting it), :func:`collate` pads a list of encoded turns into ``[B, T]`` tensors.

Layout of a row (right padding): ``prompt ids | output ids | pad``. Every per-token tensor is
aligned with ``input_ids``: ``loss_mask[b, t] = 1`` where ``input_ids[b, t]`` is an output
token, and ``behaviour_logprobs[b, t]`` is the serving engine's log q of that token. The model's
logits at position t−1 predict position t, so the learner scores ``input_ids[:, 1:]`` with
``logits[:, :-1]`` and uses ``loss_mask[:, 1:]`` / ``behaviour_logprobs[:, 1:]``.

Masks come from lengths, never from comparing ids to the pad id: SmolLM2 pads with EOS, so an
EOS that ends a reply would be masked out by an id comparison.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class TrainTurn:
    """One served turn with its reward (a row of the rewards table)."""

    turn_id: str
    task: str
    prompt_token_ids: list[int] | None
    """Prompt ids exactly as served (chat template applied). None: re-tokenize ``input_messages``."""
    input_messages: list[dict[str, Any]] | None
    """OpenAI-style messages; used only when ``prompt_token_ids`` is missing."""
    output_token_ids: list[int] | None
    """Sampled ids as served (vLLM includes the stop token). None: re-tokenize ``output_text``."""
    output_text: str
    behaviour_logprobs: list[float] | None
    """log q per output token, logged at sampling time. None: no importance correction (ρ = 1)."""
    reward: float
    group_id: str | None = None
    """Turns sharing a prompt (several samples of one request) share a group id (GRPO baseline)."""
    adapter_version: int | None = None
    """The adapter version that served the turn (the lake's ``turns.adapter_version``); None = the base model."""
    weight: float = 1.0
    """Per-turn loss weight in (0, 1], multiplied into the staleness weight. 1 = fresh traffic;
    the learner's replay sets < 1 on turns trained before (age decay), so old data keeps a say
    without outvoting new data. train_step rejects a value outside (0, 1]."""


@dataclass(frozen=True)
class EncodedTurn:
    """A turn as token ids; ``behaviour`` is None when the importance ratio cannot be computed."""

    turn: TrainTurn
    prompt_ids: list[int]
    output_ids: list[int]
    behaviour: list[float] | None
    retokenized_prompt: bool
    retokenized_output: bool


def _encode_prompt(turn: TrainTurn, tokenizer) -> tuple[list[int], bool]:
    if turn.prompt_token_ids is not None:
        return list(turn.prompt_token_ids), False
    if not turn.input_messages:
        raise ValueError(f"turn {turn.turn_id!r}: neither prompt_token_ids nor input_messages; the lake row is incomplete")
    text = tokenizer.apply_chat_template(turn.input_messages, add_generation_prompt=True, tokenize=False)
    # The template already holds the special tokens; add_special_tokens would add a second BOS.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]), True


def encode_turns(turns: Sequence[TrainTurn], tokenizer) -> tuple[list[EncodedTurn], dict[str, float]]:
    """Token ids for every turn, plus counts of what had to be reconstructed.

    Re-tokenized outputs carry no stop token (the text does not show whether the reply stopped
    on EOS). Their logged behaviour logprobs are kept only if their count matches the new ids;
    otherwise the turn counts as ``behaviour_mismatch`` and trains with ρ = 1. Turns with logged
    ids whose logprob count differs are an upstream bug and raise. Turns with no output token
    are dropped and counted (``empty_outputs``): they have nothing to score.
    """
    out: list[EncodedTurn] = []
    counts = {"turns_in": float(len(turns)), "retokenized_prompts": 0.0, "retokenized_outputs": 0.0,
              "missing_behaviour": 0.0, "behaviour_mismatch": 0.0, "empty_outputs": 0.0}
    for turn in turns:
        prompt, re_prompt = _encode_prompt(turn, tokenizer)
        if turn.output_token_ids is not None:
            output, re_output = list(turn.output_token_ids), False
        else:
            output, re_output = list(tokenizer(turn.output_text, add_special_tokens=False)["input_ids"]), True
        if not prompt:
            raise ValueError(f"turn {turn.turn_id!r}: empty prompt; the first output token needs a context")
        if not output:
            counts["empty_outputs"] += 1
            continue
        behaviour = None if turn.behaviour_logprobs is None else [float(x) for x in turn.behaviour_logprobs]
        if behaviour is not None and len(behaviour) != len(output):
            if not re_output:
                raise ValueError(f"turn {turn.turn_id!r}: {len(behaviour)} behaviour logprobs for "
                                 f"{len(output)} output tokens; the serving log is misaligned")
            counts["behaviour_mismatch"] += 1
            behaviour = None
        elif behaviour is None:
            counts["missing_behaviour"] += 1
        counts["retokenized_prompts"] += re_prompt
        counts["retokenized_outputs"] += re_output
        out.append(EncodedTurn(turn, prompt, output, behaviour, re_prompt, re_output))
    return out, counts


@dataclass
class Batch:
    """Padded tensors of B turns (see the module docstring for the alignment)."""

    input_ids: Any  # [B, T] long: prompt + output + pad
    attention_mask: Any  # [B, T] long: 1 on prompt and output
    loss_mask: Any  # [B, T] float: 1 on output tokens only
    behaviour_logprobs: Any  # [B, T] float: log q on output tokens, 0 elsewhere and where missing
    has_behaviour: Any  # [B] bool: False = no logged logprobs; the learner uses ρ = 1
    prompt_lens: list[int]
    output_lens: list[int]

    @property
    def num_tokens(self) -> int:
        return int(sum(self.output_lens))

    def to(self, device: Any) -> "Batch":
        """The same batch with its tensors on ``device`` (lengths stay Python lists)."""
        return dataclasses.replace(self, **{f: getattr(self, f).to(device) for f in (
            "input_ids", "attention_mask", "loss_mask", "behaviour_logprobs", "has_behaviour")})


def collate(items: Sequence[EncodedTurn], pad_token_id: int) -> Batch:
    """Right-pad encoded turns to ``[B, max(prompt+output)]``; masks from lengths only."""
    import torch

    if not items:
        raise ValueError("collate() got no turns")
    B = len(items)
    T = max(len(e.prompt_ids) + len(e.output_ids) for e in items)
    input_ids = torch.full((B, T), int(pad_token_id), dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T), dtype=torch.float32)
    behaviour = torch.zeros((B, T), dtype=torch.float32)
    has_behaviour = torch.zeros(B, dtype=torch.bool)
    for b, e in enumerate(items):
        p, o = len(e.prompt_ids), len(e.output_ids)
        input_ids[b, : p + o] = torch.tensor(e.prompt_ids + e.output_ids, dtype=torch.long)
        attention[b, : p + o] = 1
        loss_mask[b, p: p + o] = 1.0
        if e.behaviour is not None:
            behaviour[b, p: p + o] = torch.tensor(e.behaviour, dtype=torch.float32)
            has_behaviour[b] = True
    return Batch(input_ids, attention, loss_mask, behaviour, has_behaviour,
                 [len(e.prompt_ids) for e in items], [len(e.output_ids) for e in items])
