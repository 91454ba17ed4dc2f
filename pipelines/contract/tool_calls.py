"""OpenAI function tools <-> the text a hermes-style model reads and writes.

SmolLM2-Instruct (the served model) learned tool calls as text: the system
prompt lists the tools as JSON inside ``<tools>...</tools>`` and the model
answers ``<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`` (a JSON
list, or one object, per tag). Its chat template does not render tools, so the
gateway renders them here, deterministically: the recorded prompt is then
exactly what was served, and the learner trains on the same text.

The exact system block (``tools_system_prompt``), ``<TOOLS>`` being
``json.dumps([function, ...], ensure_ascii=False)`` of the tools' ``function``
objects in the order given (``{"type": "function", "function": {...}}`` is
unwrapped; a bare ``{"name", "description", "parameters"}`` is taken as is)::

    You are an expert in composing functions. You are given a question and a set of possible functions.
    Based on the question, you may make one or more function/tool calls to achieve the purpose.
    If none of the functions can be used, or no call is needed, answer the user directly, without a <tool_call> block.
    If the given question lacks the parameters required by the function, point it out.
    You have access to the following tools:
    <tools><TOOLS></tools>
    To call tools, reply with exactly this format, and make sure the parameter types are correct:
    <tool_call>[{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": "value2"}}]</tool_call>

It is SmolLM2's training prompt (its model card), except that a plain answer is
allowed when no tool fits: customer apps send tools to chat models that must
still chat. Everything here is pure and total: parsing never raises.

A forced call (OpenAI ``tool_choice: "required"`` or ``{"type": "function",
"function": {"name": N}}``) is served without guided decoding: the assistant
turn is prefilled with the opening of a call (``call_prefix``), so the model
continues inside one. ``with_tools(..., tool_choice)`` appends that prefix as a
final, partial assistant message: the engine continues it (vLLM
``continue_final_message``), it is part of the prompt, and the model's reply is
the prefix plus what it sampled::

    required      <tool_call>[{"name": "
    named N       <tool_call>[{"name": "N", "arguments":

Each prefix ends where SmolLM2's tokenizer splits the text anyway (before the
name, before `` {``) and with no trailing space, which chat templates strip
from a continued message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

TOOLS_OPEN, TOOLS_CLOSE = "<tools>", "</tools>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

_HEAD = (
    "You are an expert in composing functions. You are given a question and a set of possible functions.\n"
    "Based on the question, you may make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, or no call is needed, answer the user directly, "
    "without a <tool_call> block.\n"
    "If the given question lacks the parameters required by the function, point it out.\n"
    "You have access to the following tools:\n"
)
_TAIL = (
    "\nTo call tools, reply with exactly this format, and make sure the parameter types are correct:\n"
    '<tool_call>[{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": "value2"}}]'
    "</tool_call>"
)
# A closed block, or an unclosed one running to the end (the model stopped or hit max_tokens).
_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|\Z)", re.S)


def function_of(tool: dict) -> dict:
    """The function object of an OpenAI tool (``{"type": "function", "function": f}`` -> f);
    a bare function object is returned as is."""
    f = tool.get("function") if isinstance(tool, dict) else None
    return f if isinstance(f, dict) else tool


def tools_system_prompt(tools: list[dict]) -> str:
    """The hermes-style system block listing ``tools`` (format in the module docstring)."""
    listed = json.dumps([function_of(t) for t in tools], ensure_ascii=False)
    return f"{_HEAD}{TOOLS_OPEN}{listed}{TOOLS_CLOSE}{_TAIL}"


def call_prefix(tool_choice: str | dict | None) -> str:
    """The text a forced call's assistant turn starts with ("" unless ``tool_choice`` forces one):
    "required" opens a call up to the function's name, a named choice up to its arguments."""
    if tool_choice == "required":
        return CALL_OPEN + '[{"name": "'
    if isinstance(tool_choice, dict):
        name = function_of(tool_choice).get("name")
        if isinstance(name, str) and name:
            return CALL_OPEN + '[{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments":'
    return ""


def with_tools(messages: list[dict], tools: list[dict] | None, tool_choice: str | dict | None = None) -> list[dict]:
    """``messages`` with the tools block as the system prompt: appended (after a blank line) to
    an existing first system message, else prepended as one; a ``tool_choice`` that forces a call
    adds the final assistant message holding ``call_prefix``. None or [] tools returns them
    unchanged. The input list and its dicts are not modified."""
    if not tools:
        return list(messages)
    block = tools_system_prompt(tools)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        own = out[0].get("content") or ""
        out[0]["content"] = f"{own}\n\n{block}" if own else block
    else:
        out = [{"role": "system", "content": block}, *out]
    prefix = call_prefix(tool_choice)
    return [*out, {"role": "assistant", "content": prefix}] if prefix else out


@dataclass(frozen=True)
class Call:
    """One call the model wrote. ``error`` is None when the call is well-formed (a name and an
    object of arguments); then ``name`` and ``arguments`` are set. ``raw`` is the call's JSON text."""

    name: str | None
    arguments: dict | None
    raw: str
    error: str | None


@dataclass(frozen=True)
class ParsedCalls:
    """A reply split into prose and calls. ``content`` is the text outside the ``<tool_call>``
    blocks, stripped; ``attempted`` says the model tried to call a tool (a ``<tool_call>`` tag,
    or the whole reply a bare JSON object with "name" and "arguments"), even if every call is
    malformed."""

    content: str
    calls: tuple[Call, ...]
    attempted: bool

    @property
    def valid(self) -> tuple[Call, ...]:
        """The well-formed calls."""
        return tuple(c for c in self.calls if c.error is None)


def _call(obj: Any, raw: str) -> Call:
    if not isinstance(obj, dict):
        return Call(None, None, raw, f"a call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return Call(None, None, raw, "missing name")
    args = obj.get("arguments", {})
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError as e:
            return Call(name, None, raw, f"arguments must be an object (invalid JSON string: {e})")
    if not isinstance(args, dict):
        return Call(name, None, raw, "arguments must be an object")
    return Call(name, args, raw, None)


def _block_calls(body: str) -> list[Call]:
    text = body.strip()
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        return [Call(None, None, text, f"invalid JSON in <tool_call>: {e}")]
    if isinstance(obj, list):
        return [_call(o, json.dumps(o, ensure_ascii=False)) for o in obj]
    return [_call(obj, text)]


def parse_tool_calls(text: str) -> ParsedCalls:
    """Split a model reply into prose and tool calls. Total: any string gives a result."""
    if not isinstance(text, str):
        return ParsedCalls("", (), False)
    if CALL_OPEN in text:
        calls: list[Call] = []
        for m in _BLOCK.finditer(text):
            calls += _block_calls(m.group(1))
        return ParsedCalls(_BLOCK.sub("", text).strip(), tuple(calls), True)
    stripped = text.strip()
    if stripped.startswith("{") and '"name"' in stripped:
        try:
            obj = json.loads(stripped)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict) and "name" in obj and "arguments" in obj:
            return ParsedCalls("", (_call(obj, stripped),), True)
    return ParsedCalls(text.strip(), (), False)


def check_call(call: Call, tools: list[dict]) -> str | None:
    """None when ``call`` names one of ``tools`` and its arguments are valid against that tool's
    ``parameters`` (JSON Schema Draft 2020-12; a tool without parameters takes any object);
    else the reason, for a person to read."""
    if call.error is not None:
        return call.error
    spec = {function_of(t).get("name"): function_of(t) for t in tools}.get(call.name)
    if spec is None:
        return f"unknown tool {call.name!r}"
    schema = spec.get("parameters") or {"type": "object"}
    try:
        err = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(schema).iter_errors(call.arguments))
    except Exception as e:  # noqa: BLE001 - a bad schema ($ref to nowhere, bad regex, ...) is a reason, not a crash

        return f"tool {call.name!r} has an unusable parameters schema: {e}"
    if err is None:
        return None
    where = "/".join(str(p) for p in err.absolute_path) or "(root)"
    return f"arguments invalid at {where}: {err.message}"


def _arguments(a: Any) -> Any:
    if isinstance(a, str):
        try:
            return json.loads(a)
        except ValueError:
            return a
    return {} if a is None else a


def render_assistant_tool_calls(content: str | None, tool_calls: list[dict] | None) -> str:
    """The text the model produced for an OpenAI assistant message with ``tool_calls``
    (``[{id, type: "function", function: {name, arguments: <JSON string>}}]``): the content, then
    one ``<tool_call>[...]</tool_call>`` block holding every call, as the tools prompt asks.
    Parsing the result gives back the content and the calls."""
    prose = (content or "").strip()
    if not tool_calls:
        return prose
    listed = [{"name": function_of(c).get("name"), "arguments": _arguments(function_of(c).get("arguments"))}
              for c in tool_calls]
    block = f"{CALL_OPEN}{json.dumps(listed, ensure_ascii=False)}{CALL_CLOSE}"
    return f"{prose}\n{block}" if prose else block
