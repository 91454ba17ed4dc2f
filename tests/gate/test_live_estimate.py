"""The off-policy estimate, wired (pipelines/gate/live_estimate.py), on the tiny model and a real lake:
held-back conversations are never trained on; the champion scored on its own logged turns estimates
its own mean; a candidate trained on inverted rewards is estimated worse than the champion and kept
out of the canary, one trained on the true rewards is not; too few turns refuse."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import timedelta

import pytest

from pipelines.config import TracerlConfig
from pipelines.config.train import OptimizerSettings, TrainConfig
from pipelines.contract.events import Message, ModelTurn
from pipelines.gate.live_estimate import held_back_turns, offpolicy_verdict, target_logprobs
from pipelines.gate.offpolicy import OK, REFUSE, WORSE
from pipelines.lake.holdout import held_back
from pipelines.models.tiny import make_tiny_llama
from pipelines.reward.engine import run_rewards
from pipelines.train.batch import TrainTurn
from pipelines.train.run import new_training_turns
from pipelines.train.step import train_step
from tests.reward.reward_lake import at, fb, land, now

TENANT, TASK = "acme", "support"
GOOD, BAD = "Yes, thanks.", "No."   # liked and disliked reply, whatever the question


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny", seed=0, warmup_steps=0)


def _train(base: object = "tiny", seed: int = 0) -> TrainConfig:
    return TrainConfig(base_model=str(base), seed=seed,
                       optimizer=OptimizerSettings(lr=5e-3, steps_per_iteration=8, micro_batch_size=8))


def _turn(tok, tid: str, prompt: str, reply: str, reward: float) -> TrainTurn:
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    return TrainTurn(turn_id=tid, task=TASK, prompt_token_ids=ids, input_messages=None,
                     output_token_ids=list(tok(reply, add_special_tokens=False)["input_ids"]), output_text=reply,
                     behaviour_logprobs=None, reward=reward, group_id=prompt)


def _per_token(tiny, turns: list[TrainTurn]) -> list[list[float]]:
    """The base model's log q per output token: what vLLM would have logged serving these replies."""
    import torch

    from pipelines.train.batch import collate, encode_turns
    from pipelines.train.step import build_policy, output_logprobs

    model, tok = build_policy(tiny, None, _train(), 0)
    model.eval()
    enc, _ = encode_turns(turns, tok)
    with torch.no_grad():
        b = collate(enc, tok.eos_token_id)
        lp = output_logprobs(model, b.input_ids, b.attention_mask, b.loss_mask)
    return [lp[i, p - 1:p - 1 + o].tolist() for i, (p, o) in enumerate(zip(b.prompt_lens, b.output_lens))]


def _traces(share: float, want: bool):
    return (f"tr-{i}" for i in itertools.count() if held_back(TENANT, f"tr-{i}", share) == want)


@pytest.fixture(scope="module")
def lake(tiny, tmp_path_factory):
    """120 held-back conversations served by the base model (half GOOD and thumbed up, half BAD and
    thumbed down, every reply with its logged logprobs) and 20 ordinary ones."""
    from transformers import AutoTokenizer

    cfg = TracerlConfig(home=tmp_path_factory.mktemp("home"))
    cfg.train = _train(tiny)
    cfg.canary = replace(cfg.canary, enabled=True, holdout_share=0.5)
    tok = AutoTokenizer.from_pretrained(tiny)
    held, kept = _traces(0.5, True), _traces(0.5, False)
    specs = [(next(held), f"Logged question {i}?", GOOD if i % 2 else BAD) for i in range(120)]
    specs += [(next(kept), f"Ordinary question {i}?", GOOD) for i in range(20)]
    turns = [_turn(tok, f"t{i}", p, r, 0.0) for i, (_, p, r) in enumerate(specs)]
    events = []
    for i, ((trace, prompt, reply), t, lq) in enumerate(zip(specs, turns, _per_token(tiny, turns))):
        env = dict(tenant=TENANT, app="bot", task=TASK, trace_id=trace)
        events.append(ModelTurn(**env, turn_id=t.turn_id, turn_index=0, event_time=at(i), model="m",
                                input_messages=[Message(role="user", content=prompt)], output_text=reply,
                                prompt_token_ids=t.prompt_token_ids, output_token_ids=t.output_token_ids,
                                output_logprobs=lq))
        events.append(fb(t.turn_id, "thumbs", t=i + 1, value=1 if reply == GOOD else -1, trace_id=trace))
    land(cfg.lake, events)
    run_rewards(cfg.lake, now=now(1000) + timedelta(days=2))
    return cfg, tok


def _candidate(tiny, tok, tmp_path, liked: str) -> object:
    """An adapter trained from the base on fresh prompts where ``liked`` earns +1 and the other reply -1."""
    other = BAD if liked == GOOD else GOOD
    data = [_turn(tok, f"x{i}{k}", f"Training question {i}?", reply, 1.0 if reply == liked else -1.0)
            for i in range(16) for k, reply in enumerate((liked, other))]
    return train_step(tiny, None, data, _train(), tmp_path / "adapter", seed=0).adapter_dir


def test_held_back_conversations_are_never_training_turns_once_the_canary_is_on(lake):
    cfg, _ = lake
    logged = held_back_turns(cfg, TENANT, TASK, None, 1000)
    assert len(logged) == 120 and all(held_back(TENANT, _trace(cfg, t.turn.turn_id), 0.5) for t in logged)
    trainable = {t.turn_id for t in new_training_turns(cfg, TENANT, TASK, 1000)}
    assert len(trainable) == 20 and not trainable & {t.turn.turn_id for t in logged}
    off = replace(cfg, canary=replace(cfg.canary, enabled=False))  # off: the learner sees every conversation
    assert len(new_training_turns(off, TENANT, TASK, 1000)) == 140
    assert held_back_turns(cfg, TENANT, TASK, 7, 1000) == []  # served by another adapter: not the champion's


def _trace(cfg, turn_id: str) -> str:
    from pipelines.lake.query import connect

    return connect(cfg.lake).execute("SELECT trace_id FROM turns WHERE turn_id = ?", [turn_id]).fetchone()[0]


def test_the_champion_on_its_own_turns_estimates_its_own_mean(lake, tiny):
    cfg, _ = lake
    logged = held_back_turns(cfg, TENANT, TASK, None, 1000)
    target = target_logprobs(tiny, None, [t.turn for t in logged], cfg.train)
    assert target == pytest.approx([t.behaviour for t in logged], abs=1e-3)  # the same forward, w = 1


def test_inverted_rewards_are_estimated_worse_and_kept_out_of_the_canary(lake, tiny, tmp_path):
    cfg, tok = lake
    bad = offpolicy_verdict(cfg, TENANT, TASK, _candidate(tiny, tok, tmp_path / "bad", BAD), None)
    assert bad.verdict == WORSE, bad.reason
    assert bad.estimate.value < bad.champion_value and bad.estimate.ess >= cfg.canary.offpolicy_min_ess
    good = offpolicy_verdict(cfg, TENANT, TASK, _candidate(tiny, tok, tmp_path / "good", GOOD), None)
    assert good.verdict == OK, good.reason
    assert good.estimate.value > good.champion_value > bad.estimate.value


def test_too_few_held_back_turns_refuse_to_judge(lake, tiny, tmp_path):
    cfg, _ = lake
    few = replace(cfg, canary=replace(cfg.canary, offpolicy_max_turns=10))  # under offpolicy_min_ess = 30
    v = offpolicy_verdict(few, TENANT, TASK, tmp_path / "never-loaded", None)
    assert v.verdict == REFUSE and "10 held-back settled turns" in v.reason
