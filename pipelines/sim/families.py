"""Hidden-preference families: what simulated users of one task like, and what they are asked.

Each family is a small frozen dataclass with a `name`, the tenant's `task`, `prompts(split)`
(train and heldout never share a topic; heldout prompts become the task's private eval), the
`tools` it sends (tools family only) and `liked(reply)`: a rule on the reply alone (its text,
token count, finish reason, tool calls), never on the prompt. The learner never sees the rule,
only what users do about it (sessions.py).

The rules are tuned so that SmolLM2-135M-Instruct, sampled at T=1, top_p 1, lands between 2%
and 20% liked on the held-out prompts (docs/learning.md "Simulated users" has the measured
rates): rare enough that most feedback is negative, common enough that a group of samples
sometimes holds a positive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from pipelines.contract.tool_calls import (Call, check_call, function_of, parse_tool_calls, render_assistant_tool_calls,
                                           with_tools)
from pipelines.sim.env import HiddenPreference


@dataclass(frozen=True)
class Reply:
    """A served reply as an app sees it: text, completion tokens, finish reason, and the tool calls
    when the server returned them structured (OpenAI `message.tool_calls`)."""

    text: str
    tokens: int
    finish_reason: str | None
    tool_calls: tuple[dict, ...] = ()

    @classmethod
    def from_chat(cls, response: dict[str, Any]) -> "Reply":
        """From an OpenAI chat completion (the gateway's answer)."""
        choice = response["choices"][0]
        msg = choice.get("message") or {}
        return cls(msg.get("content") or "", int((response.get("usage") or {}).get("completion_tokens", 0)),
                   choice.get("finish_reason"), tuple(msg.get("tool_calls") or ()))


class Family(Protocol):
    name: str
    task: str
    tools: tuple[dict, ...] | None

    def liked(self, reply: Any) -> bool: ...

    def prompts(self, split: str) -> list[list[dict]]: ...


def reply_text(reply: Any) -> str:
    """The reply's full text, tool calls rendered back as the model wrote them."""
    calls = getattr(reply, "tool_calls", ()) or ()
    return render_assistant_tool_calls(reply.text, list(calls)) if calls else (reply.text or "")


def model_input(family: Any, messages: list[dict]) -> list[dict]:
    """What the served model reads for `messages`: the family's tools rendered in as the gateway
    does, and a forced call's opening as a final assistant message (the app's tool_choice)."""
    tools = getattr(family, "tools", None)
    return with_tools(messages, list(tools), getattr(family, "tool_choice", None)) if tools else messages


def split_prompts(topics: tuple[str, ...], templates: tuple[str, ...], heldout: int, split: str) -> list[list[dict]]:
    """The last `heldout` topics are held out: a heldout prompt never shares a topic with training."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split={split!r}; use 'train' or 'heldout'")
    chosen = topics[:-heldout] if split == "train" else topics[-heldout:]
    return [[{"role": "user", "content": t.format(x)}] for x in chosen for t in templates]


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE.split(text.strip()) if s]


class _Topics:
    """Prompts from `topics` x `templates`; the last `heldout` topics are the private eval's."""

    topics: tuple[str, ...]
    templates: tuple[str, ...]
    heldout: int

    def _check_heldout(self) -> None:
        if not 0 < self.heldout < len(self.topics):
            raise ValueError(f"heldout={self.heldout}: must be in [1, {len(self.topics) - 1}] topics")

    def prompts(self, split: str) -> list[list[dict]]:
        return split_prompts(self.topics, self.templates, self.heldout, split)


class _Pattern(_Topics):
    """Users like a reply in which `pattern` matches (case-insensitive), wherever it is."""

    pattern: str

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise ValueError(f"pattern={self.pattern!r} does not compile: {e}") from None
        self._check_heldout()

    def liked(self, reply: Any) -> bool:
        return re.search(self.pattern, reply_text(reply), re.IGNORECASE) is not None


# -- follow-up question ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FollowUp(_Topics):
    """Users like a reply that answers, then asks them a follow-up question: its last complete
    sentence ends with '?' and the text before it is at least one full sentence (ending in '.' or
    '!') of `min_answer_words` words in all (an answer, not a bare question). A tail cut off by
    max_tokens (no '.', '!' or '?' after the question) does not count: at 48 tokens SmolLM2 runs
    into the limit on ~95% of replies, so requiring finish "stop" would leave no positive at all."""

    name: str = "followup"
    task: str = "followup"
    min_answer_words: int = 6     # "Sure!" is not an answer; six words is a short real sentence
    heldout: int = 12             # topics held out for the private eval (12 x 4 templates = 48 items)
    tools: tuple[dict, ...] | None = None
    topics: tuple[str, ...] = (
        "a birthday party", "a trip to Lisbon", "a new laptop", "learning Spanish", "a vegetable garden",
        "a job interview", "a home workout", "a wedding toast", "moving house", "a camping weekend",
        "a small shop website", "a reading list", "a dinner party", "a road trip", "a first marathon",
        "a home office", "a podcast", "a budget for next month", "a science fair project", "a family reunion",
        "a kitchen makeover", "a beach holiday", "a book club", "a new puppy", "a photography hobby",
        "a charity run", "a ski trip", "a retirement party", "a bike commute", "a language exchange",
        "a picnic", "a board game night", "a museum visit", "a baby shower", "a coding course", "a garage sale")
    templates: tuple[str, ...] = ("I want some advice on {}.", "Can you help me plan {}?",
                                  "What should I know about {}?", "Give me a tip for {}.")

    def __post_init__(self) -> None:
        if self.min_answer_words < 1:
            raise ValueError(f"min_answer_words={self.min_answer_words}: must be >= 1 (an answer before the question)")
        self._check_heldout()

    def liked(self, reply: Any) -> bool:
        text = reply_text(reply).strip()
        end = max(text.rfind("."), text.rfind("!"), text.rfind("?"))
        parts = sentences(text[:end + 1])   # complete sentences: the cut-off tail dropped
        if len(parts) < 2 or not parts[-1].endswith("?"):
            return False
        answer = parts[:-1]
        return answer[-1][-1:] in ".!" and len(" ".join(answer).split()) >= self.min_answer_words


# -- content: a concrete turnaround ---------------------------------------------------------------

_SPAN = r"\b\d+(?:\s*(?:-|–|to|or)\s*\d+)?\s*(?:business\s+|working\s+)?(?:hours?|days?|weeks?)\b"


@dataclass(frozen=True)
class Fact(_Pattern):
    """Users of a support desk like a reply that commits to a concrete turnaround: a number of
    hours, days or weeks ("within 24 hours", "3-5 business days"), not "as soon as possible"."""

    name: str = "fact"
    task: str = "fact"
    pattern: str = _SPAN          # a number (or range) followed by hours / days / weeks
    heldout: int = 12
    tools: tuple[dict, ...] | None = None
    topics: tuple[str, ...] = (
        "my refund", "a damaged package", "a late delivery", "a password reset", "a cancelled order",
        "a warranty claim", "a billing error", "an account upgrade", "a missing item", "an exchange",
        "a price match", "a subscription change", "a gift card", "a duplicate charge", "a address change",
        "a broken zipper", "a store credit", "an order confirmation", "a loyalty points claim", "a size swap",
        "a return label", "a shipping upgrade", "a chargeback", "a data export", "a repair booking",
        "a locked account", "an invoice copy", "a bulk order", "a pre-order", "a back-order",
        "a faulty charger", "a lost parcel", "a rebate form", "a student discount", "a plan downgrade",
        "a survey reward")
    templates: tuple[str, ...] = ("How long does {} take?", "When will {} be sorted out?",
                                  "I am still waiting on {}. What happens next?", "Can you help me with {}?")



# -- tools: a valid call through the OpenAI tools API -----------------------------------------------

def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


WEATHER = _fn("get_weather", "Current weather for a city.", {"city": {"type": "string", "minLength": 2}}, ["city"])
TOOLS: tuple[dict, ...] = (  # a harder app: three tools, the model picks one (Tools(tools=TOOLS, forced_tool=None))
    WEATHER,
    _fn("convert_currency", "Convert an amount between two currencies (ISO 4217 codes).",
        {"amount": {"type": "number"}, "from_currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
         "to_currency": {"type": "string", "pattern": "^[A-Z]{3}$"}}, ["amount", "from_currency", "to_currency"]),
    _fn("get_local_time", "The local time in a city.", {"city": {"type": "string", "minLength": 2}}, ["city"]),
)


@dataclass(frozen=True)
class Tools(_Topics):
    """Users of a weather app ask about a city's weather; the app sends its one tool with the
    OpenAI `tools` API and forces it (`tool_choice` naming `forced_tool`: the gateway opens the call,
    the model writes the arguments). Users like the reply iff every call is valid against the
    tools sent (check_call is None for each, and there is at least one). The app then runs the
    call (`run_tool`) and reports the real outcome as a ToolCall event, like production: an
    invalid call is an implicit negative on every turn, explicit vote or not.

    Why this app and not a harder one: SmolLM2-135M-Instruct almost never writes a valid call
    unforced. On the held-out prompts (4 samples each, T=1, 48 tokens, vLLM on CPU) three tools
    and tool_choice "auto" liked 0/128, "required" 0/128 (32 well-formed calls, 6 naming a tool);
    this app liked 3/128 (2.3%, bench/RESULTS.md "tools family on SmolLM2"). What the model must
    learn is the arguments: it mostly invents keys (`location`, `country`, `argument1`) or
    nests objects where `{"city": "<city>"}` is wanted. `TOOLS` with `forced_tool=None` is the
    harder app, for a larger model."""

    name: str = "tools"
    task: str = "tools"
    tools: tuple[dict, ...] | None = (WEATHER,)
    forced_tool: str | None = "get_weather"
    heldout: int = 8
    topics: tuple[str, ...] = (
        "Paris", "Tokyo", "Nairobi", "Toronto", "Madrid", "Sydney", "Oslo", "Lima", "Seoul", "Cairo",
        "Dublin", "Mumbai", "Denver", "Prague", "Hanoi", "Lagos", "Vienna", "Santiago", "Helsinki", "Manila",
        "Athens", "Bogota", "Zurich", "Perth", "Accra", "Montreal", "Lyon", "Osaka", "Quito", "Riga")
    templates: tuple[str, ...] = ("What's the weather in {} right now?", "Is it warm in {} today?",
                                  "Will I need a coat in {} today?", "How hot is it in {}?")

    def __post_init__(self) -> None:
        if not self.tools:
            raise ValueError("tools=(): the tools family needs at least one tool to send")
        names = [function_of(t).get("name") for t in self.tools]
        if self.forced_tool is not None and self.forced_tool not in names:
            raise ValueError(f"forced_tool={self.forced_tool!r} is not one of the tools sent {names}")
        self._check_heldout()

    @property
    def tool_choice(self) -> dict | None:
        """The app's OpenAI `tool_choice`: the forced tool by name, else None (the model decides)."""
        return {"type": "function", "function": {"name": self.forced_tool}} if self.forced_tool else None

    def calls(self, reply: Any) -> tuple[Call, ...]:
        return parse_tool_calls(reply_text(reply)).calls

    def liked(self, reply: Any) -> bool:
        calls = self.calls(reply)
        return bool(calls) and all(check_call(c, list(self.tools or ())) is None for c in calls)

    def run_tool(self, call: Call) -> tuple[str, str | None]:
        """(outcome, error) of running `call` in the simulated app: invalid_arguments when
        check_call rejects it, error when the city is one the app's backend does not know."""
        reason = check_call(call, list(self.tools or ()))
        if reason is not None:
            return "invalid_arguments", reason
        city = (call.arguments or {}).get("city")
        if city is not None and city.strip().casefold() not in {t.casefold() for t in self.topics}:
            return "error", f"unknown city {city[:40]!r}"
        return "ok", None


# -- style: a greeting first ------------------------------------------------------------------------

_GREETING = r"^\W*(hi|hello|hey|greetings|good (morning|afternoon|evening)|dear)\b"


@dataclass(frozen=True)
class Style(_Pattern):
    """Users of a friendly shop like a reply that opens with a greeting ("Hi!", "Hello there,",
    "Good morning"), whatever follows."""

    name: str = "style"
    task: str = "style"
    pattern: str = _GREETING
    heldout: int = 12
    tools: tuple[dict, ...] | None = None
    topics: tuple[str, ...] = (
        "the opening hours", "gift wrapping", "the loyalty card", "a store pickup", "the return policy",
        "a size guide", "the delivery fee", "a discount code", "the new collection", "a rain check",
        "the wish list", "a product review", "the outlet store", "a repair service", "the newsletter",
        "a bulk discount", "a custom order", "the shipping times", "a price drop alert", "the gift guide",
        "an in-store event", "the rewards tiers", "a trade-in", "the student offer", "a product manual",
        "the care instructions", "a restock date", "the payment options", "a holiday sale", "the car park",
        "a fitting room", "the warranty terms", "a gift receipt", "the click and collect", "an allergy label",
        "the eco packaging")
    templates: tuple[str, ...] = ("Tell me about {}.", "Quick question about {}.",
                                  "What can you say about {}?", "I have a question on {}.")



# -- the registry -----------------------------------------------------------------------------------

CONCISE_MAX_TOKENS = 40  # what `tracerl simulate` and the demo use for the concise family


def families() -> dict[str, Family]:
    """Every family by name, at its default (tuned) settings."""
    out: list[Family] = [HiddenPreference(max_tokens=CONCISE_MAX_TOKENS), FollowUp(), Fact(), Tools(), Style()]
    return {f.name: f for f in out}


def family(name: str) -> Family:
    """The family called `name`; a ValueError naming the known ones otherwise."""
    known = families()
    if name not in known:
        raise ValueError(f"no simulated-user family {name!r}; known: {sorted(known)}")
    return known[name]


def family_for_task(task: str) -> Family:
    """The family whose task is `task`, else concise (today's default preference)."""
    return next((f for f in families().values() if f.task == task), families()["concise"])


__all__ = ["Reply", "Family", "FollowUp", "Fact", "Tools", "Style", "TOOLS", "WEATHER", "families", "family",
           "family_for_task", "reply_text", "sentences", "split_prompts"]
