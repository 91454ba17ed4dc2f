"""The trace contract: the events customer apps produce, one Kafka message each.

These dataclasses are the single definition of the schema. The validator
(`validate.py`) and the shipped JSON Schema (`trace_event.schema.json`) are
both derived from them, so the three cannot drift apart.

Rules of the contract (also in docs/trace-contract.md):
- one message = one JSON object = one event; the message key is `trace_id`,
  so one trace's events stay ordered within one partition;
- `schema_version` is the *major* version: a breaking change bumps it;
  adding an optional field does not, and consumers keep unknown fields;
- a field with a default is optional; `None` means "not sent";
- `user` (every event type, optional) names the end user the event is about, as a pseudonym:
  the gateway sends `u_` + 32 hex (HMAC-SHA256 of the app's user id with the tenant's secret,
  `pipelines/privacy/pseudonym.py`); a direct producer may send its own id, which ingest replaces
  by that pseudonym before it lands (docs/privacy.md). At most `MAX_USER` characters, no control
  characters.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal

import orjson

SCHEMA_VERSION = 2
SUPPORTED_SCHEMA_VERSIONS = frozenset({1, 2})
V1_ADAPTER_VERSION = r"v?([0-9]+)"
"""Version 1 sent `ModelTurn.adapter_version` as text ("v3"); version 2 sends the int. A v1 turn's
text that fully matches this pattern reads as its number (ingest validates it so, the lake's
`turns` view reads it so); any other v1 text is quarantined. The one difference between 1 and 2."""

ToolOutcome = Literal["ok", "error", "timeout", "invalid_arguments"]
FeedbackKind = Literal[
    "thumbs", "rating", "accept", "edit", "reject", "regenerate", "follow_up", "comment"
]
SessionOutcome = Literal["completed", "abandoned"]
Arm = Literal["champion", "challenger"]  # which side of a canary served a turn
Role = Literal["system", "user", "assistant", "tool"]
MAX_USER = 256  # characters of an event's `user` (OpenAI's `user` field, or a producer's own id)


@dataclass(frozen=True)
class Minimum:
    """The least value of an integer field (``Annotated[int, Minimum(1)]``); the validator and the
    JSON Schema both read it, so the bound is written once, on the field."""

    value: int
    note: str = ""  # said in the error, e.g. what null means instead


AdapterVersion = Annotated[int, Minimum(1, "null is the base model")]
"""An adapter-store version number (``pipelines.adapters.version``): 3, never "v3"."""


def new_id() -> str:
    return uuid.uuid4().hex


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Message:
    """One chat message of a turn's input, OpenAI-style."""

    role: Role
    content: str
    name: str | None = None
    tool_call_id: str | None = None


@dataclass
class Sampling:
    """Sampling parameters the serving engine used; needed to interpret logprobs."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None


@dataclass(kw_only=True)
class Event:
    """Envelope shared by every event type."""

    type: ClassVar[str]
    tenant: str
    app: str
    trace_id: str
    event_id: str = field(default_factory=new_id)
    event_time: str = field(default_factory=now_rfc3339)
    schema_version: int = SCHEMA_VERSION
    task: str | None = None
    user: str | None = None  # the end user, pseudonymous in the lake (module docstring; docs/privacy.md)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: fields left at None are omitted, `type` is added."""
        out: dict[str, Any] = {"type": self.type}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = _plain(v)
        return out


@dataclass(kw_only=True)
class ModelTurn(Event):
    """One model response as served: the unit that gets a reward and a gradient.

    `output_token_ids` and `output_logprobs` are the exact sampled tokens and
    their behaviour-policy logprobs; the learner's off-policy correction needs
    them. Producers that cannot send them may omit both; the learner then
    re-tokenizes and counts that.

    `adapter_version` is the adapter that served the turn, an integer >= 1 (the number the
    adapter store and the registry use); null or absent: the base model. The learner weighs a
    turn by how many versions it is behind the one it trains from.

    `train` false marks a turn that must never be trained on (evaluation traffic, a user
    without consent): it lands and gets rewards, the learner and its replay skip it. Absent
    (every event before the field existed) means true.

    `arm` is set while a canary runs on the route (issue #15): "challenger" for a turn the
    canary's version served, "champion" for one the champion served in the same canary; null
    when no canary was running (the route had one version).
    """

    type: ClassVar[str] = "model_turn"
    task: str
    turn_id: str = field(default_factory=new_id)
    turn_index: int
    model: str
    adapter_version: AdapterVersion | None = None
    input_messages: list[Message]
    output_text: str
    output_token_ids: list[int] | None = None
    output_logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    sampling: Sampling | None = None
    finish_reason: str | None = None
    latency_ms: float | None = None
    train: bool = True
    arm: Arm | None = None


@dataclass(kw_only=True)
class ToolCall(Event):
    """A tool call the model made in a turn, and what happened when it ran."""

    type: ClassVar[str] = "tool_call"
    turn_id: str
    call_id: str = field(default_factory=new_id)
    name: str
    arguments: dict[str, Any] | None = None
    outcome: ToolOutcome
    error: str | None = None
    attempt: int = 1
    latency_ms: float | None = None


@dataclass(kw_only=True)
class Feedback(Event):
    """A user signal about one turn; may arrive minutes later, in any order.

    `value` carries the signal's magnitude where it has one: thumbs is +1 / -1,
    rating is on [`scale_min`, `scale_max`]. `text` holds the edited output
    (edit), the follow-up message (follow_up) or free text (comment).
    """

    type: ClassVar[str] = "feedback"
    turn_id: str
    kind: FeedbackKind
    value: float | None = None
    scale_min: float | None = None
    scale_max: float | None = None
    text: str | None = None
    sentiment: Literal["satisfied", "neutral", "dissatisfied"] | None = None


@dataclass(kw_only=True)
class SessionEnd(Event):
    """The end of a trace: how the whole session went."""

    type: ClassVar[str] = "session_end"
    outcome: SessionOutcome
    task_success: bool | None = None
    turns: int | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls for cls in (ModelTurn, ToolCall, Feedback, SessionEnd)
}


def wire_json(event: dict[str, Any]) -> bytes:
    """An event dict as the compact JSON sent to Kafka: orjson (5-10x faster on token and logprob
    lists), or the stdlib for what orjson will not write (an integer beyond 64 bits, which the
    contract allows in an unknown field)."""
    try:
        return orjson.dumps(event)
    except TypeError:
        return json.dumps(event, separators=(",", ":")).encode()


_SCALARS = frozenset({int, float, str, bool})


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name))
                for f in dataclasses.fields(v) if getattr(v, f.name) is not None}
    if isinstance(v, list):  # token ids and logprobs: hundreds of scalars, no call for each
        return [x if type(x) in _SCALARS else _plain(x) for x in v]
    return v
