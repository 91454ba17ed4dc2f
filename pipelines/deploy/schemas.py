"""The gateway's request schemas (pydantic, strict) and the OpenAPI document built from them.

Strict means a value of the wrong JSON type is refused, never coerced: ``max_tokens: "2"`` or
``top_k: 5.0`` would otherwise be served, then recorded in a ModelTurn the contract rejects.

Chat: the OpenAI fields the gateway serves and records. ``tools`` (function tools) and
``tool_choice`` ("auto" | "none" | "required" | ``{"type": "function", "function": {"name"}}``)
are rendered into the prompt by the gateway, never forwarded (``pipelines.contract.tool_calls``):
a choice that forces a call prefills the assistant turn with the call's opening, so sampling is
never constrained and the recorded logprobs stay the model's own. Assistant messages may carry
``tool_calls`` and tool messages answer them. Unknown fields are a 400, not passed through: anything forwarded to vLLM could change the sampling distribution (``logit_bias``,
``min_p``, guided decoding, ...) while the recorded ``Sampling`` would not say so, and the
learner's off-policy correction would silently use the wrong behaviour policy. Add a field here
(and to ``Sampling`` if it shapes sampling) to serve it. ``n`` (1 to ``MAX_N``) samples several
answers to one prompt: each choice is recorded as its own turn (the gateway's ``chat``).

Refusals are 400s in OpenAI's words and codes (``parse``, ``errors.pydantic_error``): ``param``
names the field, ``code`` is e.g. ``invalid_type``, ``unknown_parameter``, ``missing_required_parameter``.

Feedback, tool calls, session ends: derived from the contract dataclasses in
``pipelines.contract.events`` (one definition), minus ``tenant`` (the key decides it), with
size limits per field; the gateway still runs ``validate_event`` on the event it builds.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Literal, Union

import json

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import (AfterValidator, StrictBool, BaseModel, ConfigDict, Field, RootModel, StringConstraints, ValidationInfo,
                      WithJsonSchema, create_model, field_validator)
from pydantic import ValidationError as PydanticError
from pydantic_core import PydanticCustomError

from pipelines.contract.tool_calls import call_prefix, render_assistant_tool_calls, with_tools

from pipelines.contract.events import EVENT_TYPES, MAX_USER, Event
from pipelines.contract.validate import user_problem
from pipelines.deploy import errors as E
from pipelines.deploy.errors import CODES, pydantic_error

MAX_ID = 256                 # trace, turn, event and call ids
MAX_NAME = 128               # model names, app, who, tool names
MAX_TEXT = 256 * 1024        # one message's content, a feedback text, a tool error
INT32 = (-(2 ** 31), 2 ** 31 - 1)  # the lake's integer columns
MAX_TOOLS = 64               # tools per request: each one is prompt text the model must read
MAX_TOOL_CALLS = 64          # calls in one assistant message of the history
MAX_N = 16                   # choices per chat request (`n`): each one is a recorded turn

Ident = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
Id = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]  # float bounds: "decimal above maximum value"
ToolName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]  # OpenAI's rule for names


def _user_ok(v: str) -> str:
    """The contract's rule for a user id (``validate.user_problem``): what ingest would quarantine is a 400."""
    why = user_problem(v)
    if why:
        raise PydanticCustomError("invalid_user", "the user id {why}", {"why": why})
    return v


# The end user (OpenAI's `user`): recorded on the request's events as the tenant's pseudonym, never in clear
User = Annotated[str, StringConstraints(min_length=1, max_length=MAX_USER), AfterValidator(_user_ok)]


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


# -- chat -----------------------------------------------------------------------------------------

class TextPart(Strict):
    type: Literal["text"]
    text: Text


_JSON_TYPES = ["string", "number", "integer", "boolean", "array", "object", "null"]
_PARAMETERS_DOC = {  # the OpenAPI view of ``parameters``; the gateway checks the full Draft 2020-12 schema
    "anyOf": [{"type": "object", "description": 'a JSON Schema (Draft 2020-12) with "type": "object"',
               "required": ["type"],
               "properties": {"type": {"const": "object"},
                              "properties": {"type": "object", "additionalProperties": {
                                  "type": "object", "properties": {"type": {"enum": _JSON_TYPES},
                                                                   "description": {"type": "string"}}}},
                              "required": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}},
              {"type": "null"}]}


def _message_doc(schema: dict[str, Any]) -> None:
    """The OpenAPI view of a message, by role: content may be null only beside tool_calls, and
    only assistant messages carry tool_calls (what the validators below enforce)."""
    props = schema.pop("properties")
    schema.pop("required", None)
    schema.pop("additionalProperties", None)  # each variant closes itself; a closed empty top would refuse all
    content = [s for s in props["content"]["anyOf"] if s.get("type") != "null"]
    calls = [s for s in props["tool_calls"]["anyOf"] if s.get("type") != "null"]
    others = {k: v for k, v in props.items() if k not in ("role", "content", "tool_calls")}

    def variant(roles: list[str], content_ok: bool, calls_required: bool | None) -> dict[str, Any]:
        p = {"role": {"enum": roles}, **others,
             "content": {"anyOf": content} if content_ok else {"anyOf": [*content, {"type": "null"}]}}
        if calls_required is not None:
            p["tool_calls"] = {"anyOf": calls} if calls_required else props["tool_calls"]
        return {"type": "object", "properties": p, "additionalProperties": False,
                "required": ["role", *(["content"] if content_ok else []), *(["tool_calls"] if calls_required else [])]}

    schema["anyOf"] = [variant(["system", "user", "tool"], True, None), variant(["assistant"], True, False),
                       variant(["assistant"], False, True)]


class FunctionDef(Strict):
    """A function the model may call: ``parameters`` is a JSON Schema (Draft 2020-12) of an object."""

    name: ToolName
    description: Annotated[str, StringConstraints(max_length=8192)] | None = None
    parameters: Annotated[dict[str, Any] | None, WithJsonSchema(_PARAMETERS_DOC)] = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        if v.get("type") != "object":
            raise PydanticCustomError("invalid_parameters", "parameters must be a JSON Schema with "
                                      "\"type\": \"object\" (the arguments are an object), got type {got}",
                                      {"got": repr(v.get("type"))[:40]})
        try:
            Draft202012Validator.check_schema(v)
        except SchemaError as err:
            raise PydanticCustomError("invalid_parameters", "parameters is not a valid JSON Schema "
                                      "(Draft 2020-12): {why}", {"why": err.message[:200]}) from None
        return v


class FunctionTool(Strict):
    type: Literal["function"]
    function: FunctionDef


class ChosenFunction(Strict):
    name: ToolName


class NamedToolChoice(Strict):
    """``tool_choice`` naming the function the reply must call (one of the request's tools)."""

    type: Literal["function"]
    function: ChosenFunction


_TOOL_CHOICE_DOC = {  # what the validator of ChatRequest.tool_choice accepts
    "anyOf": [{"enum": ["auto", "none", "required"],
               "description": 'auto (default with tools): the model decides; none: tools are not shown; '
                              'required: the reply calls one of the tools (the gateway prefills the opening of a '
                              'call, no guided decoding: the model may still write a malformed call)'},
              {"type": "object", "required": ["type", "function"], "additionalProperties": False,
               "description": "the reply calls this function (one of the tools sent): the gateway prefills the "
                              "call up to its arguments",
               "properties": {"type": {"const": "function"},
                              "function": {"type": "object", "required": ["name"], "additionalProperties": False,
                                           "properties": {"name": {"type": "string",
                                                                   "pattern": "^[a-zA-Z0-9_-]{1,64}$"}}}}},
              {"type": "null"}]}


class CalledFunction(Strict):
    name: ToolName
    arguments: Text  # a JSON object, as text (OpenAI's wire form)

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, v: str) -> str:
        def refuse(name: str) -> None:
            raise ValueError(name)
        try:
            obj = json.loads(v, parse_constant=refuse)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict):
            raise PydanticCustomError("invalid_arguments", "arguments must be a JSON object encoded as a string, "
                                      "as the response's tool_calls gave it")
        return v


class AssistantToolCall(Strict):
    id: Id
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(Strict):
    # tool_calls is validated before content: whether content may be null depends on it
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, json_schema_extra=_message_doc)
    role: Literal["system", "user", "assistant", "tool"]
    tool_calls: Annotated[list[AssistantToolCall], Field(min_length=1, max_length=MAX_TOOL_CALLS)] | None = None
    content: Annotated[Text | Annotated[list[TextPart], Field(max_length=256)] | None,
                       Field(validate_default=True)] = None
    name: Name | None = None
    tool_call_id: Id | None = None

    @field_validator("tool_calls")
    @classmethod
    def _assistant_only(cls, v: list[AssistantToolCall] | None, info: ValidationInfo):
        role = info.data.get("role")
        if v is not None and role is not None and role != "assistant":
            raise PydanticCustomError("tool_calls_role", "tool_calls are only for assistant messages, not {role}",
                                      {"role": role})
        return v

    @field_validator("content")
    @classmethod
    def _required(cls, v, info: ValidationInfo):
        if v is None and not (info.data.get("role") == "assistant" and info.data.get("tool_calls")):
            raise PydanticCustomError("missing", "content is required (it may be null only on an assistant "
                                      "message with tool_calls)")
        return v

    def text(self) -> str:
        """What the model reads for this message: an assistant's tool calls as the text it wrote."""
        own = self.content if isinstance(self.content, str) or self.content is None else \
            "".join(p.text for p in self.content)
        if self.tool_calls:
            return render_assistant_tool_calls(own, [c.model_dump() for c in self.tool_calls])
        return own or ""


class UserHeader(Strict):
    """The ``X-Tracerl-User`` header, checked by the body field's rule."""

    user: User


class TracerlExtension(Strict):
    """Continue a trace: its id (from an earlier response), this turn's index, the calling app;
    ``train: false`` records a turn the learner must never train on (eval traffic, no consent)."""

    trace_id: Id | None = None
    turn_index: Annotated[int, Field(ge=0, le=INT32[1])] | None = None
    app: Name | None = None
    train: bool | None = None


class ChatRequest(Strict):
    model: Name
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)]
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=1 << 20)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=1 << 20)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=1 << 20)] | None = None
    seed: Annotated[int, Field(ge=0, le=2 ** 63 - 1)] | None = None
    stream: bool | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    return_token_ids: bool | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = None  # each choice is its own recorded turn
    stop: (Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]
           | Annotated[list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]],
                       Field(max_length=4)] | None) = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    user: User | None = None  # recorded as a pseudonym (docs/privacy.md); also the canary's sticky key
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Annotated[Any, WithJsonSchema(_TOOL_CHOICE_DOC)] = None  # checked by _choice
    tracerl: TracerlExtension | None = None

    @field_validator("tool_choice")
    @classmethod
    def _choice(cls, v: Any, info: ValidationInfo) -> str | dict[str, Any] | None:
        if v is None or v in ("auto", "none"):
            return v
        if isinstance(v, dict):
            try:
                v = NamedToolChoice.model_validate(v).model_dump()
            except PydanticError as err:
                first = err.errors(include_input=False, include_url=False)[0]
                where = ".".join(str(p) for p in first["loc"])
                raise PydanticCustomError("invalid_tool_choice", "{where}{why}; a named choice is "
                                          '{"type": "function", "function": {"name": <one of the tools>}}',
                                          {"where": f"at {where}: " if where else "", "why": first["msg"]}) from None
        elif v != "required":
            raise PydanticCustomError("invalid_tool_choice", 'must be "auto", "none", "required" or '
                                      '{"type": "function", "function": {"name": ...}}, got {got}',
                                      {"got": repr(v)[:40]})
        names = [t.function.name for t in info.data.get("tools") or []]
        if not names:
            raise PydanticCustomError("tool_choice_without_tools", "{got} forces a tool call, but the request "
                                      "sends no tools", {"got": "'required'" if v == "required" else
                                                                 repr(v["function"]["name"])})
        if isinstance(v, dict) and v["function"]["name"] not in names:
            raise PydanticCustomError("unknown_tool_choice", "names {name}, which is not one of the tools "
                                      "sent ({names})", {"name": repr(v["function"]["name"]),
                                                               "names": ", ".join(names)[:200]})
        return v

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, v: list[FunctionTool] | None) -> list[FunctionTool] | None:
        names = [t.function.name for t in v or []]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise PydanticCustomError("duplicate_tool", "two tools are named {name}; names must be unique",
                                      {"name": repr(dup)})
        return v

    def tools_active(self) -> bool:
        """Tools are rendered into the prompt and replies parsed for calls ("none": neither)."""
        return bool(self.tools) and self.tool_choice != "none"

    def tool_dicts(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

    def prefix(self) -> str:
        """The prefilled start of the reply: a forced call's opening (``call_prefix``), else ""."""
        return call_prefix(self.tool_choice) if self.tools_active() else ""

    def served_messages(self) -> list[dict[str, Any]]:
        """The messages the model is given, as recorded: tool calls rendered as text, the tools
        block in the system prompt when tools are active, and a forced call's ``prefix`` as the
        final (partial) assistant message."""
        msgs = [{k: v for k, v in (("role", m.role), ("content", m.text()), ("name", m.name),
                                    ("tool_call_id", m.tool_call_id)) if v is not None} for m in self.messages]
        return with_tools(msgs, self.tool_dicts() if self.tools_active() else None, self.tool_choice)

    def output_tokens(self) -> int | None:
        """What vLLM takes as the output limit (max_completion_tokens wins)."""
        return self.max_completion_tokens or self.max_tokens

    def upstream(self) -> dict[str, Any]:
        """The body for vLLM: what the client set, without our extension; with a ``prefix``, vLLM
        continues the final assistant message instead of opening a new turn."""
        body = dict(self.model_dump(exclude_none=True, exclude={"tracerl", "tools", "tool_choice", "messages"}),
                    messages=self.served_messages())
        if self.prefix():
            body.update(continue_final_message=True, add_generation_prompt=False)
        return body


# -- feedback, tool calls, session ends: from the contract ---------------------------------------

_LIMITS: dict[str, Any] = {"tenant": Ident, "trace_id": Id, "turn_id": Id, "event_id": Id, "call_id": Id, "app": Name,
                           "name": Name, "task": Ident, "event_time": Name, "text": Text, "error": Text, "user": User}


def _field_type(name: str, hint: Any) -> Any:
    """The contract's type hint with this gateway's limits (string sizes, int32 integers)."""
    args = typing.get_args(hint)
    base = args[0] if typing.get_origin(hint) in (Union, types.UnionType) and type(None) in args else hint
    if name in _LIMITS:
        return _LIMITS[name]
    if base is int:
        return Annotated[int, Field(ge=INT32[0], le=INT32[1])]
    return base


def _body_model(cls: type[Event]) -> type[Strict]:
    """A request model for one event type: required fields stay required, the rest default to
    None (= the contract's default, e.g. a fresh event_id); ``tenant`` may only repeat the key's."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {"type": (Literal[cls.type], cls.type) if cls.type == "feedback" else
                              (Literal[cls.type], ...)}
    for f in dataclasses.fields(cls):
        typ = _field_type(f.name, hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name in ("tenant", "app") or not required:
            fields[f.name] = (typ | None, None)
        else:
            fields[f.name] = (typ, ...)
    name = "".join(p.title() for p in cls.type.split("_")) + "Body"
    return create_model(name, __base__=Strict, __doc__=(cls.__doc__ or "").split("\n")[0], **fields)


FEEDBACK_BODIES: dict[str, type[Strict]] = {k: _body_model(c) for k, c in EVENT_TYPES.items() if k != "model_turn"}


class FeedbackRequest(RootModel[Annotated[Union[tuple(FEEDBACK_BODIES.values())], Field(discriminator="type")]]):
    """The body of ``POST /v1/feedback`` (for the OpenAPI document; ``type`` defaults to feedback)."""


# -- admin ----------------------------------------------------------------------------------------

Version = Annotated[int, Field(ge=1, le=INT32[1])]  # an adapter-store version (v3 is 3)


def _said_something(v: str) -> str:
    """Python's notion of blank (what the alias move checks: ``str.strip``), not the JSON pattern's:
    the Rust regex behind ``pattern`` does not count separators such as U+001D as whitespace."""
    if not v.strip():
        raise PydanticCustomError("blank", "must say why in words, not only whitespace or separators")
    return v


# recorded on the versions
Why = Annotated[str, StringConstraints(min_length=1, max_length=1000, pattern=r"\S"), AfterValidator(_said_something)]


class DeployRequest(Strict):
    """Make adapter ``version`` the registry's ``champion`` with who and why, then serve it
    (``tracerl deploy``); a version the gate or a reviewer rejected needs ``force``."""

    tenant: Ident
    task: Ident
    version: Version
    who: Name | None = None
    why: Why
    force: bool = False


class RollbackRequest(Strict):
    """Move ``champion`` back to the version it replaced, then serve it (``tracerl rollback``)."""

    tenant: Ident
    task: Ident
    who: Name | None = None
    why: Why


class SwapRequest(Strict):
    """Reconciler only: hot-swap the route to ``version``, which the caller read from ``champion``."""

    tenant: Ident
    task: Ident
    version: Version
    who: Name | None = None


Share = Annotated[float, Field(gt=0.0, lt=1.0)]  # a challenger's share of conversations


class CanaryRequest(Strict):
    """Start a canary: adapter ``version`` serves ``share`` of the route's conversations (default
    ``canary.share``), sticky per conversation, beside the champion."""

    tenant: Ident
    task: Ident
    version: Version
    share: Share | None = None
    who: Name | None = None
    why: Why
    # the registry's id of this canary (its ``tracerl.canary.id`` tag), sent by the reconciler: every
    # gateway started with it puts each conversation on the same side; absent, a new one
    canary_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")] | None = None


class CanaryShareRequest(Strict):
    """Change a running canary's share; conversations already served keep their side."""

    tenant: Ident
    task: Ident
    share: Share
    who: Name | None = None
    why: Why | None = None


class CanaryStopRequest(Strict):
    """Stop a canary: every new request goes to the champion, the challenger's finish on it."""

    tenant: Ident
    task: Ident
    who: Name | None = None
    why: Why


class ForgetRequest(Strict):
    """``POST /admin/forget``: one of the tenant's users asked to be forgotten (issue #42). ``user``
    is the app's id, as it sends it in ``user``; only its pseudonym is kept."""

    tenant: Ident
    user: User
    who: Name | None = None


class ConsentRequest(Strict):
    """``POST /admin/consent``: a user of the tenant opts out of training (``consent: false``) or in."""

    tenant: Ident
    user: User
    consent: StrictBool
    reason: Annotated[str, StringConstraints(min_length=1, max_length=500)] | None = None
    who: Name | None = None


class SwapsQuery(BaseModel):
    """Query strings are text: ``limit=5`` is read as the integer 5 (lax), ``limit=x`` is a 400."""

    model_config = ConfigDict(extra="ignore")
    limit: Annotated[int, Field(ge=1, le=100_000)] = 100


# -- validation -----------------------------------------------------------------------------------

M = typing.TypeVar("M", bound=BaseModel)


def parse(model: type[M], value: Any) -> M:
    """``value`` as ``model``, or :class:`ApiError` 400 naming the first wrong field."""
    try:
        return model.model_validate(value)
    except PydanticError as err:
        errors = [(e, _param(e["loc"], keep_last=e["type"] == "extra_forbidden"))
                  for e in err.errors(include_url=False)]
        first, param = errors[0]
        # a union (``stop``: a string or a list) fails once per member at the same field: the member
        # whose type matched says what is wrong (a list too long), not the one of another type
        same = [e for e, p in errors if p == param]
        first = next((e for e in same if E.pydantic_code(e["type"], e.get("input"), e.get("ctx")) != E.INVALID_TYPE),
                     first)
        raise pydantic_error(first, param, len({p for _, p in errors}) - 1) from None


def _field_names(models: typing.Iterable[type[BaseModel]]) -> set[str]:
    names: set[str] = set()
    for m in models:
        names |= set(m.model_fields)
    return names


CANARY_BODIES = (CanaryRequest, CanaryShareRequest, CanaryStopRequest)
_FIELDS = _field_names([TextPart, FunctionDef, FunctionTool, CalledFunction, AssistantToolCall, ChatMessage,
                        TracerlExtension, ChatRequest, RollbackRequest, DeployRequest, SwapRequest, SwapsQuery,
                        ForgetRequest, ConsentRequest, *CANARY_BODIES, *FEEDBACK_BODIES.values()])


def _param(loc: tuple, keep_last: bool = False) -> str | None:
    """pydantic's location (which names union members too, e.g. 'str') -> ``messages[0].content``;
    ``keep_last`` keeps an unknown field's own name."""
    out = ""
    for i, p in enumerate(loc):
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in _FIELDS or (keep_last and i == len(loc) - 1):
            out += f".{p}" if out else p
    return out if out or (keep_last and loc) else None


# -- the OpenAPI document -------------------------------------------------------------------------

def _json(schema: dict) -> dict:
    return {"content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _op(summary: str, auth: str | None, ok: int, body: str | None = None, errors: tuple[int, ...] = (),
        params: list | None = None, description: str | None = None, result: str | None = None) -> dict:
    codes = set(errors) | ({400, 413} if body else set()) | ({401} if auth == "tenantKey" else set()) | \
        ({403} if auth == "adminKey" else set())
    op: dict[str, Any] = {"summary": summary,
                          "responses": {str(ok): {"description": "success",
                                                  **_json(_ref(result) if result else {"type": "object"})},
                                        **{str(c): {"description": "error", **_json(_ref("Error"))}
                                           for c in sorted(codes)}}}
    if ok == 200 and summary.startswith("List swap"):
        op["responses"]["200"] = {"description": "success", **_json({"type": "array", "items": {"type": "object"}})}
    if auth:
        op["security"] = [{auth: []}]
    if body:
        op["requestBody"] = {"required": True, **_json(_ref(body))}
    if params:
        op["parameters"] = params
    if description:
        op["description"] = description
    return op


TRAIN_HEADER = "X-Tracerl-Train"  # "false": record the turn as never to be trained on
TRAIN_PARAM = {"name": TRAIN_HEADER, "in": "header", "required": False,
               "schema": {"type": "string", "enum": ["true", "false"]},
               "description": "false: record the turn with train=false (it lands and gets rewards, the learner "
                              "never trains on it: eval traffic, users without consent). Same as the body's "
                              "tracerl.train; sending both with different values is a 400. Default true."}
USER_HEADER = "X-Tracerl-User"  # the end user, for apps that cannot set the body's `user`
USER_PARAM = {"name": USER_HEADER, "in": "header", "required": False,
              "schema": {"type": "string", "minLength": 1, "maxLength": MAX_USER},
              "description": "the end user's id, for apps that cannot set the body's `user` (the body wins when "
                             "both are sent). Recorded on every event of the request as the tenant's keyed "
                             "pseudonym (u_ + 32 hex), never in clear; no control characters."}
CHAT_DESCRIPTION = ("The response's `tracerl` block (the first chunk when streaming) carries trace_id, turn_id, "
                    "turn_ids, adapter_version and train: the effective flag the turn was recorded with (header "
                    "X-Tracerl-Train or tracerl.train, true when neither is sent). With `n` > 1 each choice is "
                    "recorded as its own turn (same trace, same turn index: one group of samples of one prompt) "
                    "and carries its `turn_id` (streaming: on the first chunk of that choice).")
# What an app reads back from a chat completion beyond OpenAI's fields (gateway.ECHOED).
CHAT_COMPLETION = {"type": "object", "description": "OpenAI's chat.completion, plus tracerl's block", "properties": {
    "tracerl": {"type": "object", "required": ["trace_id", "turn_id", "adapter_version"], "properties": {
        "trace_id": {"type": "string", "description": "continue the trace with tracerl.trace_id on the next turn"},
        "turn_id": {"type": "string", "description": "what feedback and tool calls name (choice 0's with n > 1)"},
        "turn_ids": {"type": "array", "items": {"type": "string"},
                     "description": "every choice's turn id, in choice order (choices[i].turn_id too)"},
        "adapter_version": {"type": "integer", "minimum": 1,
                            "description": "the adapter version that served the turn, as `tracerl adapters` "
                                           "lists it (3 for v3); the recorded ModelTurn carries the same int"},
        "train": {"type": "boolean", "description": "the train flag the turn was recorded with"}}}}}
DEPLOY_DESCRIPTION = ("Moves the registry's `champion` alias with who and why (recorded on the model versions), "
                      "then reconciles this gateway to it, like `tracerl deploy | rollback`: the next "
                      "`deployment` run finds the route in sync and changes nothing. Deploy refuses (409) a "
                      "version the gate or a reviewer rejected unless `force` (recorded as a forced override); "
                      "404: the version is not registered. The answer: {action, registry, serving, summary}.")
SWAP_DESCRIPTION = ("The reconciler's swap primitive (`tracerl deploy`, the `deployment` asset): loads, flips, "
                    "drains, unloads, without reading the registry. A swap to a version the champion does not "
                    "name is undone by the next reconcile: operators use /admin/deploy and /admin/rollback.")

CANARY_DESCRIPTION = ("A canary's challenger serves `share` of a route's conversations beside the champion: the "
                      "side is a hash of the request's `user` (else its trace id), so a conversation never mixes "
                      "versions, and every turn records `arm` (champion | challenger). Stop sends every new "
                      "request to the champion and unloads the challenger once its requests ended; promoting "
                      "the challenger (/admin/deploy) ends the canary. 409: no champion, the champion itself, "
                      "a canary already running, no canary to change, or an adapter that does not validate. "
                      "The answer is the swap record (also in /admin/swaps).")


def openapi(version: str = "1") -> dict[str, Any]:
    """OpenAPI 3.1 for every route, its request schemas generated from the models above."""
    from pydantic.json_schema import models_json_schema

    _, defs = models_json_schema([(m, "validation") for m in (ChatRequest, FeedbackRequest, DeployRequest,
                                                                RollbackRequest, SwapRequest, *CANARY_BODIES)],
                                 ref_template="#/components/schemas/{model}")
    schemas = defs["$defs"]
    schemas["Error"] = {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"},
                       "type": {"type": "string", "enum": ["invalid_request_error", "requests", "server_error"]},
                       "param": {"type": ["string", "null"]}, "code": {"type": "string", "enum": sorted(CODES)}}}}}
    schemas["ChatCompletion"] = CHAT_COMPLETION
    limit = SwapsQuery.model_json_schema()["properties"]["limit"]
    return {
        "openapi": "3.1.0",
        "info": {"title": "tracerl gateway", "version": version,
                 "description": "OpenAI-compatible chat that records every turn; feedback; admin."},
        "components": {"schemas": schemas, "securitySchemes": {
            "tenantKey": {"type": "http", "scheme": "bearer", "description": "a tenant's API key"},
            "adminKey": {"type": "http", "scheme": "bearer", "description": "the admin key"}}},
        "paths": {
            "/v1/chat/completions": {"post": _op("Chat completion (JSON or SSE), recorded as a ModelTurn",
                                                 "tenantKey", 200, "ChatRequest", (404, 502), params=[TRAIN_PARAM, USER_PARAM],
                                                 description=CHAT_DESCRIPTION, result="ChatCompletion")},
            "/v1/feedback": {"post": _op("Feedback, a tool call or a session end for one of this tenant's traces",
                                         "tenantKey", 202, "FeedbackRequest", (403, 404), params=[USER_PARAM])},
            "/v1/models": {"get": _op("This tenant's public model names", "tenantKey", 200)},
            "/v1/models/{model}": {"get": _op("One of this tenant's models (task, or tenant/task)", "tenantKey", 200,
                                              errors=(404,), params=[
                {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}])},
            "/admin/deploy": {"post": _op("Make an adapter version the registry's champion, then serve it",
                                          "adminKey", 200, "DeployRequest", (404, 409),
                                          description=DEPLOY_DESCRIPTION)},
            "/admin/rollback": {"post": _op("Move the champion back to the version it replaced, then serve it",
                                            "adminKey", 200, "RollbackRequest", (409,),
                                            description=DEPLOY_DESCRIPTION)},
            "/internal/swap": {"post": _op("Reconciler only: hot-swap a route to the champion's version",
                                           "adminKey", 200, "SwapRequest", (409,), description=SWAP_DESCRIPTION)},
            "/admin/swaps": {"get": _op("List swap records, oldest first", "adminKey", 200, errors=(400,), params=[
                {"name": "limit", "in": "query", "required": False, "schema": limit}])},
            "/admin/stats": {"get": _op("Gateway, emitter, route and vLLM replica counters", "adminKey", 200)},
            "/admin/canary": {"post": _op("Start a canary: a challenger version serves a share of the conversations",
                                          "adminKey", 200, "CanaryRequest", (409,), description=CANARY_DESCRIPTION),
                              "get": _op("Every running canary: version, share, requests per side", "adminKey", 200)},
            "/admin/canary/share": {"post": _op("Change a running canary's share", "adminKey", 200,
                                                "CanaryShareRequest", (409,), description=CANARY_DESCRIPTION)},
            "/admin/canary/stop": {"post": _op("Stop a canary: all traffic back to the champion", "adminKey", 200,
                                               "CanaryStopRequest", (409,), description=CANARY_DESCRIPTION)},
            "/health": {"get": _op("Liveness: the emitter's state and how many vLLM replicas serve", None, 200, errors=(503,))},
            "/openapi.json": {"get": _op("This document", None, 200)},
        },
    }
