"""Plain-Python reference of the reward engine: same spec, same inputs, same outputs.

Written for clarity, from the pure rules in `rules.py`, one event at a time.
It exists to check the SQL engine (tests compare them on random traffic, the
benchmark on 1M events) and to make the semantics readable in one place.
`compute` takes the same inputs as one engine run (new signals, pending
signals, settled-turn registry) and returns the same four outputs.

Keys carry the tenant, as in the SQL: a turn is (tenant, trace_id, turn_id),
a trace (tenant, trace_id), an event (tenant, event_id).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable

import pyarrow.parquet as pq

from pipelines.reward import hindsight, rules
from pipelines.reward.spec import RewardSpec, SpecBook

ENVELOPE = ["event_id", "type", "app", "task", "trace_id", "turn_id", "event_time", "ingested_at", "payload"]
TYPES = ("model_turn", "tool_call", "feedback", "session_end")


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return None


def _int(v: Any) -> int | None:
    """An INTEGER (int32) field: anything else, or out of range, counts as not sent."""
    return v if isinstance(v, int) and not isinstance(v, bool) and -2**31 <= v < 2**31 else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def signal(row: dict[str, Any], tenant: str) -> dict[str, Any]:
    """One event row of the lake -> one signal (the same columns the SQL extraction yields).

    Parses the raw `payload` itself rather than reading the hot columns the SQL
    side reads, so the comparison also checks what ingest stored there. A field
    counts only for the event types the contract gives it to.
    """
    p = json.loads(row["payload"])
    t = row["type"]
    turn, tool, fb, end = t == "model_turn", t == "tool_call", t == "feedback", t == "session_end"
    text = _str(p.get("output_text")) if turn else None
    success = p.get("task_success") if end else None
    return {
        "event_id": row["event_id"], "type": t, "tenant": tenant, "app": row["app"], "task": row["task"],
        "trace_id": row["trace_id"], "turn_id": row["turn_id"],
        "event_time": row["event_time"], "ingested_at": row["ingested_at"],
        "kind": _str(p.get("kind")) if fb else _str(p.get("outcome")) if tool or end else None,
        "value": _num(p.get("value")) if fb else None,
        "scale_min": _num(p.get("scale_min")) if fb else None,
        "scale_max": _num(p.get("scale_max")) if fb else None,
        "sentiment": _str(p.get("sentiment")) if fb else None,
        "success": success if isinstance(success, bool) else None,
        "call_id": _str(p.get("call_id")) if tool else None,
        "attempt": (_int(p.get("attempt")) or 1) if tool else None,
        "turn_index": _int(p.get("turn_index")) if turn else None,
        "latency_ms": _num(p.get("latency_ms")) if turn or tool else None,
        "out_chars": len(text) if text is not None else (0 if turn else None),
        "text_class": rules.text_class(text) if turn else None,
        "user_text": _last_user(p.get("input_messages")) if turn else None,
        "out_text": text,
    }


def _last_user(messages: Any) -> str | None:
    """The content of the request's last user message (the hot column `user_text`)."""
    for m in reversed(messages if isinstance(messages, list) else []):
        if isinstance(m, dict) and m.get("role") == "user":
            return _str(m.get("content"))
    return None


def read_signals(files: Iterable[str]) -> list[dict[str, Any]]:
    """Read event files of the lake (hive layout: tenant from the folder name)."""
    out = []
    for f in files:
        tenant = next(part.split("=", 1)[1] for part in str(f).split("/") if part.startswith("tenant="))
        for row in pq.read_table(f, columns=ENVELOPE).to_pylist():
            if row["type"] in TYPES:
                out.append(signal(row, tenant))
    return out


def turn_key(s: dict) -> tuple:
    return (s["tenant"], s["trace_id"], s["turn_id"])


def trace_key(s: dict) -> tuple:
    return (s["tenant"], s["trace_id"])


def event_key(s: dict) -> tuple:
    return (s["tenant"], s["event_id"])


def _ord(s: dict) -> tuple:
    return (s["event_time"], s["ingested_at"], s["event_id"])


def signal_component(s: dict, spec: RewardSpec) -> tuple[str | None, float | None]:
    """What one feedback / tool signal contributes on its own (for corrections)."""
    k = s["kind"]
    if s["type"] == "tool_call":
        return "tool", rules.tool([k], spec)
    if s["type"] != "feedback":
        return None, None
    if k == "thumbs":
        return "thumbs", rules.thumbs(s["value"])
    if k == "rating":
        return "rating", rules.rating(s["value"], s["scale_min"], s["scale_max"], spec)
    if k in rules.OUTPUT_KINDS:
        return "output", rules.output(k, spec)
    if k == "regenerate":
        return "regenerate", rules.regenerate(True, spec)
    if k == "follow_up":
        return "follow_up", rules.follow_up(s["sentiment"], spec)
    return None, None


@dataclass
class Output:
    settled: list[dict] = field(default_factory=list)
    provisional: list[dict] = field(default_factory=list)
    corrections: list[dict] = field(default_factory=list)
    pending: list[dict] = field(default_factory=list)


def compute(new: list[dict], book: SpecBook, now: datetime, pending: Iterable[dict] = (),
            registry: Iterable[dict] = ()) -> Output:
    spec = lambda tenant, task: book.resolve(tenant, task)  # noqa: E731
    # 1. all signals, deduplicated per tenant by event_id: a pending copy wins, else the first to arrive.
    sig: dict[tuple, dict] = {}
    for s in pending:
        sig.setdefault(event_key(s), {**s, "is_new": False})
    for s in sorted(new, key=lambda s: (s["ingested_at"], s["event_time"])):
        sig.setdefault(event_key(s), {**s, "is_new": True})
    by_type: dict[str, list[dict]] = defaultdict(list)
    for s in sig.values():
        by_type[s["type"]].append(s)

    # 2. known turns: first arrival per turn; settled turns of these traces from the registry.
    reg = {turn_key(r): {**r, "settled_before": True} for r in registry}
    turns: dict[tuple, dict] = dict(reg)
    for s in sorted(by_type["model_turn"], key=lambda s: (s["ingested_at"], s["event_id"])):
        if s["turn_id"] is not None and turn_key(s) not in turns:
            turns[turn_key(s)] = {**s, "turn_time": s["event_time"], "settled_before": False}
    last_index: dict[tuple, int] = {}
    for t in turns.values():
        if t["turn_index"] is not None:
            k = trace_key(t)
            last_index[k] = max(last_index.get(k, t["turn_index"]), t["turn_index"])
    # hindsight: each turn paired with the next turn of its trace, over the first arrival of every
    # model turn among the signals (settled turns of the registry carry no text)
    firsts: dict[tuple, dict] = {}
    for s in sorted(by_type["model_turn"], key=lambda s: (s["ingested_at"], s["event_id"])):
        if s["turn_id"] is not None:
            firsts.setdefault(turn_key(s), {**s, "turn_time": s["event_time"]})
    hs = hindsight.next_turn_hindsight(firsts.values())
    trace_turns: dict[tuple, list[dict]] = defaultdict(list)
    for t in turns.values():
        trace_turns[trace_key(t)].append(t)

    # 3. per-turn feedback and tool calls, per-trace session end.
    fb: dict[tuple, list[dict]] = defaultdict(list)
    for s in by_type["feedback"]:
        fb[turn_key(s)].append(s)
    tools: dict[tuple, list[dict]] = defaultdict(list)
    for s in by_type["tool_call"]:
        tools[turn_key(s)].append(s)
    session: dict[tuple, dict] = {}
    for s in by_type["session_end"]:
        k = trace_key(s)
        if k not in session or _ord(s) > _ord(session[k]):
            session[k] = s

    out = Output()
    rows: dict[tuple, dict] = {}
    for tid, t in turns.items():
        sp = spec(t["tenant"], t["task"])
        fs = sorted(fb.get(tid, []), key=_ord)
        last = lambda pred: next((f for f in reversed(fs) if pred(f)), None)  # noqa: E731
        th = last(lambda f: f["kind"] == "thumbs" and f["value"] is not None and f["value"] != 0)
        ra = last(lambda f: f["kind"] == "rating" and f["value"] is not None)
        ou = last(lambda f: f["kind"] in rules.OUTPUT_KINDS)
        fu = last(lambda f: f["kind"] == "follow_up" and f["sentiment"] in ("satisfied", "dissatisfied"))
        calls = tools.get(tid, [])
        keys = {c["call_id"] or c["event_id"] for c in calls}
        n_retries = len({c["call_id"] or c["event_id"] for c in calls if (c["attempt"] or 1) > 1})
        se = session.get(trace_key(t))
        share = None
        if se is not None and t["turn_index"] is not None and trace_key(t) in last_index:
            share = rules.session_share(t["turn_index"], last_index[trace_key(t)], sp)
        abandon, sess = rules.session_values(se["kind"], se["success"], sp) if se else (None, None)
        comp = {
            "thumbs": rules.thumbs(th["value"]) if th else None,
            "rating": rules.rating(ra["value"], ra["scale_min"], ra["scale_max"], sp) if ra else None,
            "output": rules.output(ou["kind"], sp) if ou else None,
            "regenerate": rules.regenerate(any(f["kind"] == "regenerate" for f in fs), sp),
            "follow_up": rules.follow_up(fu["sentiment"], sp) if fu else None,
            "abandon": abandon * share if abandon is not None and share is not None else None,
            "session": sess * share if sess is not None and share is not None else None,
            "tool": rules.tool([c["kind"] for c in calls], sp) if keys else None,
            "retries": rules.retries(n_retries, len(keys), sp),
            "latency": rules.latency(t.get("latency_ms"), sp),
            "length": rules.length(t.get("out_chars"), sp),
            "hindsight": None if t["settled_before"] or tid not in hs else rules.hindsight(
                hs[tid].kind, hs[tid].confidence, any(f["kind"] == "regenerate" for f in fs),
                fu["sentiment"] if fu else None, sp),
        }
        dodge = rules.dodge(t.get("text_class"), t.get("out_chars") or 0, len(keys), sp)
        labelled, total = rules.combine(comp, dodge, sp)
        window = t["turn_time"] + timedelta(seconds=sp.settle.window_s)
        at_end = se["event_time"] + timedelta(seconds=sp.settle.session_end_grace_s) if se else None
        settle_at = min(window, at_end) if at_end is not None else window
        row = {"tenant": t["tenant"], "app": t["app"], "task": t["task"], "trace_id": t["trace_id"],
               "turn_id": t["turn_id"], "turn_index": t["turn_index"], "turn_time": t["turn_time"], **comp,
               "dodge": dodge, "labelled": labelled, "total": total,
               "settled": not t["settled_before"] and settle_at <= now, "settle_at": settle_at,
               "settle_reason": "session_end" if at_end is not None and at_end < window else "window",
               "spec_version": sp.version_id, "_share": share, "_before": t["settled_before"]}
        rows[tid] = row
        if not row["_before"]:
            (out.settled if row["settled"] else out.provisional).append(row)

    # 4. corrections: new events for settled turns, and orphans that outlived their window.
    def correction(s, reason, turn_id, component, value, version):
        return {"event_id": s["event_id"], "event_type": s["type"], "kind": s["kind"], "tenant": s["tenant"],
                "app": s["app"], "task": s["task"], "trace_id": s["trace_id"], "turn_id": turn_id,
                "event_time": s["event_time"], "reason": reason, "component": component, "value": value,
                "spec_version": version}

    orphan_expired: dict[tuple, bool] = {}
    for s in sig.values():
        if s["type"] in ("feedback", "tool_call") and turn_key(s) not in turns or \
                s["type"] == "session_end" and trace_key(s) not in trace_turns:
            sp = spec(s["tenant"], s["task"])
            orphan_expired[event_key(s)] = s["event_time"] + timedelta(seconds=sp.settle.window_s) <= now
    for s in sig.values():
        if not s["is_new"]:
            continue
        if s["type"] != "session_end" and turn_key(s) in rows and rows[turn_key(s)]["_before"]:
            t = turns[turn_key(s)]
            out.corrections.append(correction(s, "after_settle", s["turn_id"],
                                              *signal_component(s, spec(t["tenant"], t["task"])),
                                              rows[turn_key(s)]["spec_version"]))
        elif s["type"] == "session_end" and trace_key(s) in trace_turns:
            emitted = False
            for t in trace_turns[trace_key(s)]:
                r = rows[turn_key(t)]
                if not r["_before"] or r["_share"] is None:
                    continue
                sp = spec(t["tenant"], t["task"])
                for comp, v in zip(("abandon", "session"), rules.session_values(s["kind"], s["success"], sp)):
                    if v is not None:
                        out.corrections.append(correction(s, "after_settle", t["turn_id"], comp, v * r["_share"],
                                                          r["spec_version"]))
                        emitted = True
            if not emitted and all(rows[turn_key(t)]["_before"] for t in trace_turns[trace_key(s)]):
                out.corrections.append(correction(s, "after_settle", None, None, None,
                                                  spec(s["tenant"], s["task"]).version_id))
    for key, expired in orphan_expired.items():
        if expired:
            s = sig[key]
            sp = spec(s["tenant"], s["task"])
            out.corrections.append(correction(s, "unknown_turn", s["turn_id"], *signal_component(s, sp),
                                              sp.version_id))

    # 5. the next pending set.
    open_turns = {turn_key(r) for r in out.provisional}
    open_traces = {trace_key(r) for r in out.provisional}
    for s in sig.values():
        keep = (s["type"] != "session_end" and turn_key(s) in open_turns) or \
               (s["type"] == "session_end" and trace_key(s) in open_traces) or \
               orphan_expired.get(event_key(s)) is False
        if keep:
            out.pending.append({k: v for k, v in s.items() if k != "is_new"})
    for r in out.settled + out.provisional:
        r.pop("_share"), r.pop("_before")
    return out

