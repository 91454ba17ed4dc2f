"""The reward spec: which signals count, how much, and when a turn's reward is final.

A spec is typed (frozen dataclasses), versioned (`version` is declared by the
operator; `version_id` adds a hash of every resolved value, so two different
specs can never share an id) and resolved per tenant/task from TOML:

    built-in defaults  <  [default]  <  [tenant.<t>]  <  [tenant.<t>.task.<k>]

Every component is a value on [-1, 1]; the total is sum(weight * component).
Each default below carries the reason it is set that way. Most of them encode
a reward hack seen in production (docs/measured.md, Cursor's real-time RL):
broken tool calls that cost nothing, and needless clarifying questions that
dodge risky edits. See docs/rewards.md.

Which spec file scores a tenant/task is configuration (``[reward] spec``, per target
overridable); ``reward_spec_book(cfg)`` is the one resolver the CLI and Dagster both call.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipelines.lake.tables import COMPONENTS

if TYPE_CHECKING:
    from pipelines.config import TracerlConfig

# The rewards dataset's component columns (in order) are the lake's: `lake.tables.COMPONENTS`.
# `latency` and `length` are cost terms: they adjust a labelled turn, they never label one by themselves.
COST_COMPONENTS = ("latency", "length")
# Explicit feedback: the user judged the reply (thumbs, rating) or acted on it (accept / edit / reject).
# One of these > 0 lifts the dodge cap (Dodge.explicit_overrides); implicit signals never do.
EXPLICIT_COMPONENTS = ("thumbs", "rating", "output")


@dataclass(frozen=True)
class Weights:
    """reward = sum(weight * component); 0 turns a component off."""

    thumbs: float = 1.0       # the clearest explicit signal
    rating: float = 1.0       # rating scaled to [-1, 1]; same scale as thumbs
    output: float = 0.75      # accept / edit / reject: Cursor Tab used +0.75 for accept
    regenerate: float = 0.5   # "try again": negative, but users also regenerate to explore
    follow_up: float = 0.5    # sentiment of the next message; noisier than an explicit vote
    abandon: float = 0.5      # session-level: spread over turns by `credit`
    session: float = 0.5      # task_success true/false, session-level
    tool: float = 1.0         # worst tool outcome of the turn; 1.0 so a broken call costs a thumbs-down
    retries: float = 0.25     # extra attempts cost a little even when the retry worked
    latency: float = 0.0      # off: latency is mostly serving infrastructure, not the policy
    length: float = 0.0       # off: length penalties collapse replies (docs/measured.md: 8-token answers)
    hindsight: float = 0.25   # the next user message (complaint, re-ask, thanks): read by a heuristic, so a
                              # quarter of a vote; an explicit vote on the same turn always outweighs it


@dataclass(frozen=True)
class Explicit:
    rating_min: float = 1.0   # scale used when a rating event carries no scale_min/scale_max
    rating_max: float = 5.0


@dataclass(frozen=True)
class Implicit:
    """Component values (on [-1, 1]) of implicit feedback; `output` family is last-wins."""

    accept: float = 1.0
    edit: float = 0.25        # kept but needed fixing: better than reject, worse than accept
    reject: float = -1.0      # reverted / discarded
    regenerate: float = -1.0
    satisfied: float = 1.0    # follow_up sentiment; "neutral" is no signal (conversation goes on)
    dissatisfied: float = -1.0
    abandoned: float = -1.0   # session_end outcome "abandoned"
    success: float = 1.0      # session_end task_success = true
    failure: float = -1.0     # task_success = false; None is no signal


@dataclass(frozen=True)
class HindsightSignals:
    """Hindsight: what the next user message of the trace says about a reply (`hindsight.py`).

    The `hindsight` component is the kind's value here x the classifier's confidence, for a
    confidence >= `min_confidence`; a kind valued 0 is no signal. It is implicit: it never lifts
    the dodge cap, and it stays out where the turn already has the same evidence explicitly (a
    `reask` beside a `regenerate`, a `complaint` / `thanks` beside a follow-up sentiment).
    """

    complaint: float = -1.0   # "that's wrong", "not what I asked"
    reask: float = -1.0       # the same question again, or a rephrase of it
    thanks: float = 1.0       # "thanks!", "perfect"
    new_topic: float = 0.0    # moving on: weak evidence either way (off)
    min_confidence: float = 0.6


@dataclass(frozen=True)
class Tools:
    """Tool outcome values. The turn's `tool` component is the WORST outcome of its calls.

    Worst, not mean: with a mean, padding a broken call with cheap ok calls would
    dilute its penalty. `ok` is 0 so the model is never paid just for calling a tool:
    a broken call is then below a correct call AND below not calling at all.
    """

    ok: float = 0.0
    timeout: float = -0.25            # often the tool's fault, still not free
    error: float = -0.5
    invalid_arguments: float = -1.0   # the model's own fault: as bad as a thumbs-down
    retry_cap: int = 3                # retries component = -min(retries, cap) / cap


@dataclass(frozen=True)
class Costs:
    latency_budget_ms: float = 10_000.0   # latency component = -min(latency / budget, 1)
    length_budget_chars: float = 4_000.0  # length component = -min(chars / budget, 1)


@dataclass(frozen=True)
class Dodge:
    """Silence and clarifying questions must not be a cheap way out of negative reward.

    A turn with no tool call whose output is empty ("silent"), or a short question
    ("clarify": ends with '?', at most `clarify_max_chars`), is always labelled and
    its total is min(total, cap): without an explicit positive signal it never scores
    above the cap (implicit credit such as session success or a satisfied follow-up
    does not lift it), and an unlabelled one gets the cap rather than dropping out.

    An explicit positive (thumbs, rating or output component > 0: the user liked the
    reply or acted on it) is evidence the heuristic may not override: with
    `explicit_overrides` such a dodge scores its ordinary weighted sum, so a liked
    reply that ends with a question can be learned.
    """

    cap: float | None = -0.25         # None disables; must be <= 0. At -0.25 a dodge only pays when the
                                      # answer would most likely have been rejected; raise toward 0 for
                                      # tasks where asking back is often right (ambiguous requests)
    clarify_max_chars: int = 300      # longer answers that end with a question are answers
    explicit_overrides: bool = True   # a thumbs up / rating above the middle / accept or edit lifts the cap.
                                      # False = always capped: then a liked reply ending with a follow-up
                                      # question scored -0.25, below a neutral answer, and was never learned


@dataclass(frozen=True)
class LastTurn:
    """Session outcome goes entirely to the turn with the highest turn_index."""

    rule: Literal["last_turn"] = "last_turn"


@dataclass(frozen=True)
class Discounted:
    """Turn i of a session whose last turn is L gets gamma ** (L - i) of the outcome.

    Shares below `min_share` are dropped (that turn stays unlabelled by the
    session), so a long session does not label its first turns with noise.
    """

    rule: Literal["discounted"] = "discounted"
    gamma: float = 0.5
    min_share: float = 0.05


@dataclass(frozen=True)
class Uniform:
    """Every turn of the session gets the full outcome."""

    rule: Literal["uniform"] = "uniform"


CreditRule = LastTurn | Discounted | Uniform
CREDIT_RULES: dict[str, type] = {"last_turn": LastTurn, "discounted": Discounted, "uniform": Uniform}


@dataclass(frozen=True)
class Settle:
    """A turn's reward is final at min(turn_time + window, session_end_time + grace), in event time."""

    window_s: float = 3600.0           # feedback in the sample traffic arrives within 10 min
    session_end_grace_s: float = 900.0  # ratings often come after the session closes


@dataclass(frozen=True)
class RewardSpec:
    version: str = "builtin-1"
    weights: Weights = field(default_factory=Weights)
    explicit: Explicit = field(default_factory=Explicit)
    implicit: Implicit = field(default_factory=Implicit)
    tools: Tools = field(default_factory=Tools)
    costs: Costs = field(default_factory=Costs)
    dodge: Dodge = field(default_factory=Dodge)
    credit: CreditRule = field(default_factory=Discounted)
    settle: Settle = field(default_factory=Settle)
    hindsight: HindsightSignals = field(default_factory=HindsightSignals)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self.weights):
            w = getattr(self.weights, f.name)
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"weights.{f.name} = {w!r}: weights must be finite and >= 0 (0 turns it off)")
        t = self.tools
        for name in ("ok", "timeout", "error", "invalid_arguments"):
            if not -1.0 <= getattr(t, name) <= 1.0:
                raise ValueError(f"tools.{name} = {getattr(t, name)!r} must be on [-1, 1]")
        worst_ok = min(t.ok, 0.0)
        for name in ("timeout", "error", "invalid_arguments"):
            if getattr(t, name) >= worst_ok:
                raise ValueError(f"tools.{name} = {getattr(t, name)!r} must be below min(tools.ok, 0) = {worst_ok}: "
                                 "a broken tool call must never score as well as a correct call or no call")
        if self.weights.tool <= 0:
            raise ValueError("weights.tool = 0 makes broken tool calls free (a known reward hack); keep it > 0")
        if t.retry_cap < 1:
            raise ValueError(f"tools.retry_cap = {t.retry_cap!r} must be >= 1")
        if not self.explicit.rating_min < self.explicit.rating_max:
            raise ValueError(f"explicit.rating_min {self.explicit.rating_min} must be < rating_max {self.explicit.rating_max}")
        if self.dodge.cap is not None and not -1.0 <= self.dodge.cap <= 0.0:
            raise ValueError(f"dodge.cap = {self.dodge.cap!r} must be on [-1, 0] (or unset to disable): "
                             "above 0 a clarifying question would beat a neutral answer")
        if not isinstance(self.dodge.explicit_overrides, bool):
            raise ValueError(f"dodge.explicit_overrides = {self.dodge.explicit_overrides!r} must be true or false")
        if isinstance(self.credit, Discounted) and not (0 < self.credit.gamma <= 1 and 0 <= self.credit.min_share < 1):
            raise ValueError(f"credit gamma {self.credit.gamma!r} must be on (0, 1] and min_share on [0, 1)")
        if self.settle.window_s <= 0 or self.settle.session_end_grace_s < 0:
            raise ValueError(f"settle.window_s {self.settle.window_s!r} must be > 0 and grace >= 0")
        h = self.hindsight
        for name in ("complaint", "reask", "thanks", "new_topic"):
            v = getattr(h, name)
            if not (isinstance(v, (int, float)) and -1.0 <= v <= 1.0):
                raise ValueError(f"hindsight.{name} = {v!r} must be on [-1, 1]")
        if not (isinstance(h.min_confidence, (int, float)) and 0.0 <= h.min_confidence <= 1.0):
            raise ValueError(f"hindsight.min_confidence = {h.min_confidence!r} must be on [0, 1]")
        for f in dataclasses.fields(self.implicit):
            if not -1.0 <= getattr(self.implicit, f.name) <= 1.0:
                raise ValueError(f"implicit.{f.name} = {getattr(self.implicit, f.name)!r} must be on [-1, 1]")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @functools.cached_property
    def version_id(self) -> str:
        """`<version>+<hash>`: the declared version plus a hash of every resolved value."""
        body = json.dumps(self.as_dict(), sort_keys=True, default=str).encode()
        return f"{self.version}+{hashlib.sha256(body).hexdigest()[:8]}"

    @property
    def total_bound(self) -> float:
        """|total| can never exceed this: every component is on [-1, 1]."""
        return sum(getattr(self.weights, f.name) for f in dataclasses.fields(self.weights))

    def params(self) -> dict[str, Any]:
        """Flat values for the SQL engine (one row per tenant/task)."""
        w, i, t, c, d, s = self.weights, self.implicit, self.tools, self.costs, self.dodge, self.settle
        credit = self.credit
        return {
            **{f"w_{k}": float(getattr(w, k)) for k in COMPONENTS},
            "rating_min": float(self.explicit.rating_min), "rating_max": float(self.explicit.rating_max),
            **{f"v_{f.name}": float(getattr(i, f.name)) for f in dataclasses.fields(i)},
            "t_ok": float(t.ok), "t_timeout": float(t.timeout), "t_error": float(t.error),
            "t_invalid": float(t.invalid_arguments), "retry_cap": float(t.retry_cap),
            "latency_budget_ms": float(c.latency_budget_ms), "length_budget_chars": float(c.length_budget_chars),
            "dodge_cap": None if d.cap is None else float(d.cap), "clarify_max_chars": int(d.clarify_max_chars),
            "dodge_explicit_overrides": int(d.explicit_overrides),  # 0/1: the engine types int params as BIGINT
            "credit_rule": credit.rule,
            "gamma": float(getattr(credit, "gamma", 1.0)), "min_share": float(getattr(credit, "min_share", 0.0)),
            "window_s": float(s.window_s), "grace_s": float(s.session_end_grace_s),
            **{f"h_{k}": float(getattr(self.hindsight, k)) for k in ("complaint", "reask", "thanks", "new_topic")},
            "h_min_confidence": float(self.hindsight.min_confidence),
            "spec_version": self.version_id,
        }


_SECTIONS = {"weights": Weights, "explicit": Explicit, "implicit": Implicit, "tools": Tools,
             "costs": Costs, "dodge": Dodge, "settle": Settle, "hindsight": HindsightSignals}


def _build(values: dict[str, Any], where: str) -> RewardSpec:
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key == "version":
            kwargs["version"] = str(value)
        elif key == "credit":
            rule = dict(value).pop("rule", "discounted")
            if rule not in CREDIT_RULES:
                raise ValueError(f"{where}.credit.rule = {rule!r}; choose one of {sorted(CREDIT_RULES)}")
            kwargs["credit"] = _section(CREDIT_RULES[rule], {k: v for k, v in value.items() if k != "rule"},
                                        f"{where}.credit")
        elif key in _SECTIONS:
            kwargs[key] = _section(_SECTIONS[key], value, f"{where}.{key}")
        else:
            raise ValueError(f"{where}: unknown key {key!r}; known: {sorted(['version', 'credit', *_SECTIONS])}")
    try:
        return RewardSpec(**kwargs)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _section(cls: type, values: Any, where: str) -> Any:
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a table, got {values!r}")
    names = {f.name for f in dataclasses.fields(cls)} - {"rule"}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(names)}")
    return cls(**values)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "credit":
            out[k] = _merge(out[k], v)
        else:
            out[k] = v  # a credit table replaces the rule wholesale: fields differ per rule
    return out


class SpecBook:
    """All specs of a deployment: defaults plus per-tenant and per-task overrides."""

    def __init__(self, doc: dict[str, Any] | None = None, source: str = "<builtin>"):
        doc = dict(doc or {})
        self.source = source
        version = doc.pop("version", None)
        self.default = dict(doc.pop("default", {}))
        if version is not None:
            self.default.setdefault("version", version)
        self.tenants = dict(doc.pop("tenant", {}))
        if doc:
            raise ValueError(f"{source}: unknown top-level key(s) {sorted(doc)}; use version, [default], [tenant.<t>]")
        self._cache: dict[tuple[str, str | None], RewardSpec] = {}
        self.resolve("*", None)  # validate defaults now, not at the first event
        for tenant, body in self.tenants.items():
            for task in [None, *dict(body).get("task", {})]:
                self.resolve(tenant, task)

    def resolve(self, tenant: str, task: str | None) -> RewardSpec:
        key = (tenant, task)
        if key not in self._cache:
            values, where = dict(self.default), f"{self.source} [default]"
            body = dict(self.tenants.get(tenant, {}))
            tasks = body.pop("task", {})
            if body:
                values, where = _merge(values, body), f"{self.source} [tenant.{tenant}]"
            if task is not None and task in tasks:
                values, where = _merge(values, tasks[task]), f"{self.source} [tenant.{tenant}.task.{task}]"
            self._cache[key] = _build(values, where)
        return self._cache[key]


def load_spec_book(path: str | Path | None = None) -> SpecBook:
    """The spec file at ``path``; None: $TRACERL_REWARD_SPEC, else ./rewards.toml, else built-in.

    Stages resolve the spec through ``reward_spec_book(cfg)`` (the configuration's ``reward.spec``
    first); this reads one named file.
    """
    return _read(Path(path) if path is not None else fallback_spec_path())


def fallback_spec_path() -> Path | None:
    """The spec when the configuration names none: $TRACERL_REWARD_SPEC, else ./rewards.toml
    (absolute, so a process started elsewhere can be handed the same file), else None (built-in)."""
    env = os.environ.get("TRACERL_REWARD_SPEC")
    if env:
        return Path(env).resolve()
    local = Path("rewards.toml")
    return local.resolve() if local.is_file() else None


def spec_path(cfg: TracerlConfig, tenant: str | None = None, task: str | None = None) -> Path | None:
    """The spec file ``tenant``/``task`` is scored by (None: the built-in spec): its ``reward.spec``
    (``[targets."<tenant>/<task>"]`` over ``[targets."<tenant>"]`` over ``[reward]``), else the fallbacks."""
    spec = (cfg.for_target(tenant, task) if tenant is not None else cfg).reward.spec
    return Path(spec) if spec else fallback_spec_path()


def reward_spec_book(cfg: TracerlConfig) -> SpecBook | TargetSpecBooks:
    """The one reward-spec resolution, shared by `tracerl reward` and the `turn_rewards` asset.

    Reads the file(s) now, on every call, so an edited spec (or a new ``reward.spec``) scores the
    next run without restarting Dagster; every file named is validated before any turn is scored.
    """
    default = spec_path(cfg)
    named = {default} | {spec_path(cfg, *_target(key)) for key, entry in cfg.targets.items() if "reward" in entry}
    books = {path: _read(path) for path in named}
    if len(books) == 1:
        return books[default]
    return TargetSpecBooks(cfg, books)


class TargetSpecBooks:
    """Spec books of a config whose targets name different spec files: each tenant/task is
    resolved in the book of its own ``reward.spec`` (same interface as ``SpecBook.resolve``)."""

    def __init__(self, cfg: TracerlConfig, books: dict[Path | None, SpecBook]):
        self.cfg, self.books = cfg, books
        self.source = ", ".join(sorted(b.source for b in books.values()))
        self._paths: dict[tuple[str, str | None], Path | None] = {}

    def resolve(self, tenant: str, task: str | None) -> RewardSpec:
        key = (tenant, task)
        if key not in self._paths:
            self._paths[key] = spec_path(self.cfg, tenant, task)
        return self.books[self._paths[key]].resolve(tenant, task)


def _target(key: str) -> tuple[str, str | None]:
    tenant, _, task = key.partition("/")
    return tenant, task or None


def _read(path: Path | None) -> SpecBook:
    if path is None:
        return SpecBook()
    if not path.exists():
        raise FileNotFoundError(f"reward spec {path} does not exist (set reward.spec in tracerl.toml, "
                                f"$TRACERL_REWARD_SPEC, or pass --spec / spec_path)")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"reward spec {path}: not valid TOML: {e}") from None
    return SpecBook(doc, source=str(path))
