"""Pure text classifiers of model replies: did it call a tool, was the call broken, did it dodge
with a clarifying question, did it refuse. Shared by stages (the gate's behaviour signatures, the
reward spec's dodge rule) so they count the same thing the same way.

Each function takes the reply text (and, for tool calls, the tools the request offered) and
returns a plain value; nothing here raises on odd input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pipelines.contract.tool_calls import check_call, parse_tool_calls

CLARIFY_MAX_CHARS = 300
"""The reward spec's Dodge.clarify_max_chars default: a longer reply ending in '?' is an answer."""

WHITESPACE = " \t\r\n"  # as the reward rules strip (pipelines.reward.rules.WHITESPACE)

REFUSAL_PATTERNS: tuple[str, ...] = (
    r"\bI can(?:'|’)?t\b", r"\bI cannot\b", r"\bI can not\b", r"\bI(?:'|’)m sorry\b", r"\bI am sorry\b",
    r"\bI(?:'|’)m (?:not able|unable) to\b", r"\bI am (?:not able|unable) to\b", r"\bI won(?:'|’)t\b",
    r"\bI will not\b", r"\bas an AI\b", r"\bI(?:'|’)m just an AI\b", r"\bI do not have (?:access|the ability)\b",
)
"""A short, documented list (docs/gate.md): the phrasings chat models use to decline. Matched
case-insensitively anywhere in the first 200 characters (a refusal leads; an answer that later
says "I can't be sure" is still mostly an answer)."""
_REFUSAL = re.compile("|".join(REFUSAL_PATTERNS), re.IGNORECASE)
REFUSAL_WINDOW = 200


@dataclass(frozen=True)
class ToolUse:
    """What a reply did with tools. ``broken``: attempted, and some call does not parse or fails
    the offered tools' schemas (or names a tool not offered). ``reason``: the first problem."""

    attempted: bool
    broken: bool
    reason: str | None = None


def tool_use(text: str, tools: list[dict[str, Any]] | None) -> ToolUse:
    """Classify ``text``'s tool calls against ``tools`` (OpenAI tools or bare functions).

    An attempt is a ``<tool_call>`` block or a bare JSON call (``parse_tool_calls``), and also a
    reply that *starts* like a bare JSON call (``{``) but does not parse: a model that writes
    bare calls and breaks them must count as breaking them, not as not calling.
    Without ``tools`` only well-formedness is checked (there is no schema to hold the call to).
    """
    if not isinstance(text, str):
        return ToolUse(False, False)
    parsed = parse_tool_calls(text)
    if not parsed.attempted:
        if text.lstrip(WHITESPACE).startswith("{"):
            return ToolUse(True, True, "a bare JSON call that does not parse")
        return ToolUse(False, False)
    if not parsed.calls:
        return ToolUse(True, True, "an empty <tool_call> block")
    for call in parsed.calls:
        why = check_call(call, tools) if tools else call.error
        if why is not None:
            return ToolUse(True, True, why)
    return ToolUse(True, False)


_STATEMENT_END = re.compile(r"[.!](?=\s|$)")


def is_clarify(text: str, attempted_call: bool, max_chars: int = CLARIFY_MAX_CHARS) -> bool:
    """A clarifying question instead of an answer: no tool call, the reply ends with '?', is at
    most ``max_chars`` characters long, and states nothing before its questions (no sentence
    ending in '.' or '!').

    Narrower than the reward spec's "clarify" dodge (pipelines.reward.rules.dodge, any short reply
    ending in '?'): an answer followed by a follow-up question is not a dodge (the user got the
    answer), and users who like follow-ups must be learnable without this guard blocking them.
    The reward side keeps the broad rule because an explicit positive lifts its cap there."""
    if attempted_call or not isinstance(text, str):
        return False
    body = text.rstrip(WHITESPACE)
    if not body.endswith("?") or len(text) > max_chars:
        return False
    return _STATEMENT_END.search(body) is None


def is_refusal(text: str) -> bool:
    """A refusal phrase (``REFUSAL_PATTERNS``) within the reply's first ``REFUSAL_WINDOW`` chars."""
    return isinstance(text, str) and _REFUSAL.search(text[:REFUSAL_WINDOW]) is not None


@dataclass(frozen=True)
class Behaviour:
    """Every classifier's answer for one reply."""

    attempted_call: bool
    broken_call: bool
    clarify: bool
    refusal: bool
    chars: int


def classify(text: str, tools: list[dict[str, Any]] | None = None,
             clarify_max_chars: int = CLARIFY_MAX_CHARS) -> Behaviour:
    t = tool_use(text, tools)
    text = text if isinstance(text, str) else ""
    return Behaviour(t.attempted, t.broken, is_clarify(text, t.attempted, clarify_max_chars), is_refusal(text),
                     len(text))
