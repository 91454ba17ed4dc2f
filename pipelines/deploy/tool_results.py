"""Tool outcomes from the conversation itself: an app that runs the model's tool calls sends the
results back as ``tool`` messages on its next request, as the OpenAI API has it. Each answer to
one of our calls becomes the calling turn's ``tool_call`` event, so tool outcomes reach the
rewards without a separate ``/v1/feedback`` call.

A call is ours when its id names the turn that made it (``call_<i>_<turn id>``, the ids the
gateway gives); the turn id is signed, so a client cannot credit or blame another tenant's
turns. Apps resend the whole history on every request: the event id is derived from the call
id, so the lake keeps one event per call however often it is resent.

How the outcome is judged, from what the request carries:
- ``invalid_arguments``: the call names no tool the request sends, or its arguments do not
  satisfy the tool's JSON schema (``check_call``, as the evals judge calls);
- ``error``: the tool message is a JSON object whose ``error`` is set (the common convention
  for a failed tool run; a tool that reports failure in prose is read as ``ok``);
- ``ok``: otherwise.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from pipelines.contract.tool_calls import Call, check_call, function_of

CALL_ID = re.compile(r"^call_(\d{1,4})_(.+)$")


def call_id(index: int, turn_id: str) -> str:
    """The id of a turn's ``index``-th tool call: it names the turn, so the answer can find it."""
    return f"call_{index}_{turn_id}"


def calling_turn(cid: str) -> str | None:
    """The turn id a call id of ours names, or None (a client's or another system's id)."""
    m = CALL_ID.match(cid)
    return m.group(2) if m else None


@dataclass(frozen=True)
class ToolResult:
    """One answered call, ready to be a ``ToolCall`` event."""

    turn_id: str
    call_id: str
    name: str
    arguments: dict[str, Any]
    outcome: str
    error: str | None

    @property
    def event_id(self) -> str:
        return f"result-{self.call_id}"


def _runs_regex(schema: Any, depth: int = 0) -> bool:
    """Whether validating against ``schema`` would run a client's regular expression (``pattern``,
    ``patternProperties``): one crafted pattern could backtrack for minutes on the event loop."""
    if depth > 64:
        return True
    if isinstance(schema, dict):
        return "pattern" in schema or "patternProperties" in schema or \
            any(_runs_regex(v, depth + 1) for v in schema.values())
    if isinstance(schema, list):
        return any(_runs_regex(v, depth + 1) for v in schema)
    return False


def judge(name: str, arguments: dict[str, Any], result: str, tools: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(outcome, error) of one call, from the tool message's text and the request's tools. A tool
    whose parameters use regular expressions has only its name checked (``_runs_regex``)."""
    safe = [t if not _runs_regex(t) else {"type": "function", "function": {"name": function_of(t).get("name")}}
            for t in tools]
    invalid = check_call(Call(name, arguments, "", None), safe)
    if invalid is not None:
        return "invalid_arguments", invalid[:500]
    try:
        obj = json.loads(result)
    except (ValueError, RecursionError):
        return "ok", None
    if isinstance(obj, dict) and obj.get("error") not in (None, "", False, {}, []):
        err = obj["error"]
        return "error", (err if isinstance(err, str) else json.dumps(err, ensure_ascii=False))[:500]
    return "ok", None


def tool_results(messages: list[Any], tools: list[dict[str, Any]] | None,
                 ours: Callable[[str], bool]) -> tuple[list[ToolResult], int]:
    """The answered calls of ours among ``messages`` (the request's ``ChatMessage`` list), and how
    many answers named a call that is not ours (unknown ids, or turns ``ours`` refuses)."""
    calls: dict[str, Any] = {}
    for m in messages:
        for c in m.tool_calls or []:
            calls[c.id] = c
    found, foreign = [], 0
    for m in messages:
        if m.role != "tool" or m.tool_call_id is None:
            continue
        turn, call = calling_turn(m.tool_call_id), calls.get(m.tool_call_id)
        if turn is None or call is None or not ours(turn):
            foreign += 1
            continue
        args = json.loads(call.function.arguments)  # a JSON object: the request's schema checked it
        outcome, error = judge(call.function.name, args, m.text(), tools or [])
        found.append(ToolResult(turn, m.tool_call_id, call.function.name, args, outcome, error))
    return found, foreign
