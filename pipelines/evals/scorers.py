"""Scorers: pure ``score(scorer, output, item) -> float in [0, 1]``, chosen by the config's type.

The config is a tagged union on ``kind`` (``parse_scorer``); ``score`` dispatches on the
dataclass type through ``_SCORERS``, never on strings scattered around. Item fields that a
scorer reads: ``reference`` (exact, similarity), ``pattern`` (regex), ``schema`` (json_schema),
``tools`` (tool_call). A scorer-level field wins over the item's.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Union

if TYPE_CHECKING:
    from pipelines.evals.suites import Item


@dataclass(frozen=True)
class Exact:
    """1 if normalized output == normalized reference (normalize: casefold + collapsed spaces)."""
    kind: str = "exact"
    normalize: bool = True


@dataclass(frozen=True)
class Regex:
    """1 if ``pattern`` (or the item's) matches anywhere in the output (``fullmatch`` for all)."""
    kind: str = "regex"
    pattern: str | None = None
    fullmatch: bool = False
    ignore_case: bool = False


@dataclass(frozen=True)
class JsonSchema:
    """1 if the output (or its first {...} block) is JSON valid against ``schema`` (or the item's)."""
    kind: str = "json_schema"
    schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class ToolCall:
    """1 if the output calls tools (a bare ``{"name", "arguments"}`` reply, or ``<tool_call>`` blocks
    holding an object or a list of them) and every call names one of ``tools`` (or the item's;
    OpenAI tools or bare ``{"name", "parameters": <JSON schema>}``) with valid arguments;
    ``expect_name`` (or the item's ``expected_tool``) further requires a call to that tool."""
    kind: str = "tool_call"
    tools: list[dict[str, Any]] | None = None
    expect_name: str | None = None


@dataclass(frozen=True)
class Similarity:
    """Similarity to the item's reference: ``token_f1`` (SQuAD-style bag-of-words F1) or
    ``char_ratio`` (difflib SequenceMatcher ratio)."""
    kind: str = "similarity"
    metric: str = "token_f1"


@dataclass(frozen=True)
class LlmJudge:
    """An OpenAI-compatible chat endpoint grades the reply 0-10 against ``instructions``; the
    first integer in its answer / 10. Only as a rubric criterion; URL/model from GateConfig."""
    kind: str = "llm_judge"
    instructions: str = "Rate how well the reply answers the user, 0 (useless) to 10 (perfect)."


@dataclass(frozen=True)
class Criterion:
    weight: float
    check: "Scorer"
    name: str = ""


@dataclass(frozen=True)
class Rubric:
    """Weighted mean of criteria, each a code check (any scorer above) or an llm_judge."""
    kind: str = "rubric"
    criteria: tuple[Criterion, ...] = field(default_factory=tuple)


Scorer = Union[Exact, Regex, JsonSchema, ToolCall, Similarity, LlmJudge, Rubric]
_KINDS: dict[str, type] = {c.kind: c for c in (Exact, Regex, JsonSchema, ToolCall, Similarity, LlmJudge, Rubric)}
SIMILARITY_METRICS = ("token_f1", "char_ratio")


def parse_scorer(spec: dict[str, Any], where: str = "scorer") -> Scorer:
    if not isinstance(spec, dict) or spec.get("kind") not in _KINDS:
        raise ValueError(f"{where}: kind={spec.get('kind') if isinstance(spec, dict) else spec!r}; "
                         f"use one of {sorted(_KINDS)}")
    cls = _KINDS[spec["kind"]]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ValueError(f"{where}: unknown fields {unknown} for kind {spec['kind']!r}; known: {sorted(known)}")
    values = dict(spec)
    if cls is Rubric:
        crit = []
        for i, c in enumerate(values.get("criteria", [])):
            if "check" not in c or float(c.get("weight", 1.0)) <= 0:
                raise ValueError(f"{where}.criteria[{i}]: needs a check table and weight > 0, got {c!r}")
            crit.append(Criterion(float(c.get("weight", 1.0)), parse_scorer(c["check"], f"{where}.criteria[{i}].check"),
                                  str(c.get("name", f"c{i}"))))
        if not crit:
            raise ValueError(f"{where}: a rubric needs at least one [[scorer.criteria]]")
        values["criteria"] = tuple(crit)
    if cls is Regex and values.get("pattern") is not None:
        try:
            re.compile(values["pattern"])
        except re.error as err:
            raise ValueError(f"{where}: pattern={values['pattern']!r} does not compile: {err}") from None
    if cls is Similarity and values.get("metric", "token_f1") not in SIMILARITY_METRICS:
        raise ValueError(f"{where}: metric={values['metric']!r}; use one of {SIMILARITY_METRICS}")
    return cls(**values)


@dataclass(frozen=True)
class Judge:
    """Where llm_judge criteria go (from GateConfig). ``None`` judge: such criteria raise."""
    url: str
    model: str
    api_key: str | None = None
    timeout: float = 60.0


# -- the scorers --------------------------------------------------------------------------------

def _norm(s: str) -> str:
    return " ".join(s.casefold().split())


def _exact(s: Exact, out: str, item: "Item", judge: Judge | None) -> float:
    if item.reference is None:
        raise ValueError("exact scorer: the item has no 'reference'")
    a, b = (_norm(out), _norm(item.reference)) if s.normalize else (out, item.reference)
    return float(a == b)


def _regex(s: Regex, out: str, item: "Item", judge: Judge | None) -> float:
    pattern = s.pattern or item.extra.get("pattern")
    if not pattern:
        raise ValueError("regex scorer: no pattern on the scorer or the item")
    flags = re.IGNORECASE if s.ignore_case else 0
    m = re.fullmatch(pattern, out.strip(), flags) if s.fullmatch else re.search(pattern, out, flags)
    return float(m is not None)


def _parse_json(out: str) -> Any:
    text = out.strip()
    try:
        return json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end <= start:
            raise
        return json.loads(text[start:end + 1])


def _valid(instance: Any, schema: dict[str, Any]) -> bool:
    import jsonschema

    return jsonschema.Draft202012Validator(schema).is_valid(instance)


def _json_schema(s: JsonSchema, out: str, item: "Item", judge: Judge | None) -> float:
    schema = s.schema or item.extra.get("schema")
    if schema is None:
        raise ValueError("json_schema scorer: no schema on the scorer or the item")
    try:
        obj = _parse_json(out)
    except ValueError:
        return 0.0
    return float(_valid(obj, schema))


def _tool_call(s: ToolCall, out: str, item: "Item", judge: Judge | None) -> float:
    """The reply's calls as pipelines/contract/tool_calls.py reads them (the gateway and the
    behaviour signatures read them the same way): 1 iff it calls, every call is valid against
    the tools (``check_call``), and, with an expected tool, one of the calls names it."""
    from pipelines.contract.tool_calls import check_call, parse_tool_calls

    tools = s.tools or item.extra.get("tools")
    if not tools:
        raise ValueError("tool_call scorer: no tools on the scorer or the item")
    calls = parse_tool_calls(out).calls
    if not calls or any(check_call(c, tools) is not None for c in calls):
        return 0.0
    expect = s.expect_name or item.extra.get("expected_tool")
    return float(not expect or any(c.name == expect for c in calls))


def token_f1(a: str, b: str) -> float:
    ta, tb = re.findall(r"\w+", a.casefold()), re.findall(r"\w+", b.casefold())
    if not ta and not tb:
        return 1.0
    common = sum((Counter(ta) & Counter(tb)).values())
    if common == 0:
        return 0.0
    p, r = common / len(ta), common / len(tb)
    return 2 * p * r / (p + r)


def _similarity(s: Similarity, out: str, item: "Item", judge: Judge | None) -> float:
    if item.reference is None:
        raise ValueError("similarity scorer: the item has no 'reference'")
    if s.metric == "char_ratio":
        import difflib

        return difflib.SequenceMatcher(None, _norm(out), _norm(item.reference)).ratio()
    return token_f1(out, item.reference)


def _llm_judge(s: LlmJudge, out: str, item: "Item", judge: Judge | None) -> float:
    """The judge sees the conversation, the reference (if any) and the reply; sent only to the
    endpoint the user configured, never logged."""
    if judge is None:
        raise ValueError("llm_judge criterion but no gate.judge_url is configured")
    convo = "\n".join(f"{m['role']}: {m.get('content', '')}" for m in item.messages)
    ref = f"\nReference answer: {item.reference}" if item.reference else ""
    prompt = f"{s.instructions}\n\nConversation:\n{convo}{ref}\n\nReply to grade:\n{out}\n\nAnswer with one integer 0-10."
    body = json.dumps({"model": judge.model, "messages": [{"role": "user", "content": prompt}],
                       "temperature": 0, "max_tokens": 8}).encode()
    headers = {"Content-Type": "application/json"}
    if judge.api_key:
        headers["Authorization"] = f"Bearer {judge.api_key}"
    req = urllib.request.Request(judge.url.rstrip("/") + "/v1/chat/completions", body, headers, method="POST")
    with urllib.request.urlopen(req, timeout=judge.timeout) as resp:
        answer = json.loads(resp.read())["choices"][0]["message"]["content"] or ""
    m = re.search(r"\d+", answer)
    if m is None:
        raise ValueError(f"judge answered without a number: {answer[:80]!r}")
    return min(int(m.group()), 10) / 10.0


def _rubric(s: Rubric, out: str, item: "Item", judge: Judge | None) -> float:
    total = sum(c.weight for c in s.criteria)
    return sum(c.weight * score(c.check, out, item, judge) for c in s.criteria) / total


_SCORERS: dict[type, Callable[..., float]] = {
    Exact: _exact, Regex: _regex, JsonSchema: _json_schema, ToolCall: _tool_call,
    Similarity: _similarity, LlmJudge: _llm_judge, Rubric: _rubric,
}


def score(scorer: Scorer, output: str, item: "Item", judge: Judge | None = None) -> float:
    return _SCORERS[type(scorer)](scorer, output, item, judge)


def uses_judge(scorer: Scorer) -> bool:
    return isinstance(scorer, LlmJudge) or (isinstance(scorer, Rubric) and any(uses_judge(c.check) for c in scorer.criteria))


def judge_from(url: str | None, model: str, api_key_env: str) -> Judge | None:
    return Judge(url, model, os.environ.get(api_key_env)) if url else None
