"""A synthetic task with a hidden user preference, emitting feedback as real trace events.

The learner never sees the preference: it sees only what users do about it
(thumbs and session outcomes), through the same Kafka -> lake -> rewards path as
production traffic. Here users like replies that finish on their own within a
few tokens and end with a full stop: concise, complete answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.contract.events import Event, Feedback, Message, ModelTurn, Sampling, SessionEnd, new_id
from pipelines.sim.policy import Sample

TOPICS = ["the weather", "an order", "a refund", "the invoice", "a password", "the meeting", "a package",
          "the report", "a bug", "the schedule", "a receipt", "the account", "a delivery", "the price",
          "a ticket", "the menu", "a booking", "the manual", "a warranty", "the address", "a coupon",
          "the login", "a return", "the budget", "a flight", "the garden", "a recipe", "the car",
          "a printer", "the library", "a meeting room", "the train"]
TEMPLATES = ["Tell me about {}.", "What is the status of {}?", "Help me with {}.", "Explain {} briefly."]


def prompts(split: str) -> list[list[dict]]:
    """'train' and 'heldout' never share a topic."""
    topics = TOPICS[:24] if split == "train" else TOPICS[24:]
    return [[{"role": "user", "content": t.format(topic)}] for topic in topics for t in TEMPLATES]


@dataclass(frozen=True)
class HiddenPreference:
    """The "concise" family (families.py): a complete reply, ending in '.', within `max_tokens`."""

    max_tokens: int = 10
    name: str = "concise"
    task: str = "concise"
    tools: tuple[dict, ...] | None = None

    def prompts(self, split: str) -> list[list[dict]]:
        return prompts(split)

    def liked(self, s: Any) -> bool:
        """`s`: a policy Sample or a families.Reply (anything with text, tokens, finish_reason)."""
        return self.liked_reply(s.text, s.tokens, s.finish_reason)

    def liked_reply(self, text: str, tokens: int, finish_reason: str | None) -> bool:
        return finish_reason == "stop" and tokens <= self.max_tokens and text.strip().endswith(".")


def episode(messages: list[dict], s: Sample, liked: bool, *, tenant: str, app: str, task: str, model: str,
            adapter_version: int | None, max_tokens: int) -> list[Event]:
    """One served turn, the user's thumbs, and the session end: what a real app would emit."""
    env = dict(tenant=tenant, app=app, trace_id=new_id(), task=task)
    turn = ModelTurn(**env, turn_index=0, model=model, adapter_version=adapter_version,
                     input_messages=[Message(**m) for m in messages], output_text=s.text,
                     output_token_ids=s.output_ids, output_logprobs=s.logprobs, prompt_token_ids=s.prompt_ids,
                     sampling=Sampling(temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens),
                     finish_reason=s.finish_reason)
    return [turn,
            Feedback(**env, turn_id=turn.turn_id, kind="thumbs", value=1 if liked else -1),
            SessionEnd(**env, outcome="completed", task_success=liked, turns=1)]
