"""The SQL engine and the plain-Python reference agree, run by run, on random traffic."""

from __future__ import annotations

import dataclasses
import random
from datetime import datetime, timedelta, timezone

import pytest

from reward_lake import land
from pipelines.contract.events import Feedback, Message
from pipelines.ingest.sample import generate
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS
from pipelines.reward import reference
from pipelines.reward.engine import run_rewards
from pipelines.lake.tables import COMPONENTS
from pipelines.reward.spec import SpecBook

START = datetime(2026, 11, 1, tzinfo=timezone.utc)
KEYS = ["tenant", "app", "task", "trace_id", "turn_id", "turn_index", "turn_time", *COMPONENTS,
        "dodge", "labelled", "total", "settled", "settle_at", "settle_reason", "spec_version"]
CUSTOM = SpecBook({"version": "t", "default": {"weights": {"latency": 0.1, "length": 0.05}},
                   "tenant": {"globex": {"credit": {"rule": "last_turn"}},
                              "acme": {"task": {"sql": {"credit": {"rule": "uniform"},
                                                        "dodge": {"cap": -0.5, "explicit_overrides": False},
                                                        "settle": {"window_s": 900}}}}}})
# Feedback put on dodge turns: explicit positives (lift the cap), implicit ones and a middle rating (do not).
DODGE_FEEDBACK = [dict(kind="thumbs", value=1), dict(kind="rating", value=5, scale_min=1, scale_max=5),
                  dict(kind="rating", value=3), dict(kind="accept"), dict(kind="edit", text="kept"),
                  dict(kind="follow_up", text="thanks", sentiment="satisfied"), dict(kind="thumbs", value=-1)]

# Next user messages the hindsight classifier reads (complaints, thanks, a re-ask of the sample's question).
HINDSIGHT_TEXT = ["That's wrong, try again.", "Thanks, that worked!", "Not what I asked.", "Perfect, thanks.",
                  "Where is my order?", "ok"]


def traffic(seed: int, n_traces: int) -> list:
    rng = random.Random(seed)
    events = generate(n_traces, seed=seed, start=START)
    turns = [e for e in events if e.type == "model_turn"]
    dodges = rng.sample(turns, 40)
    for e in dodges:                                   # dodges: silent and clarifying turns
        e.output_text = rng.choice(["", "  ", "Which order do you mean?"])
    later = [e for e in turns if e.turn_index > 0]
    for e in rng.sample(later, min(60, len(later))):   # next messages hindsight reads
        e.input_messages = [*e.input_messages[:-1], Message(role="user", content=rng.choice(HINDSIGHT_TEXT))]
    extra = []
    for e in dodges[:30]:                              # ...most with feedback, often explicitly positive
        extra.append(Feedback(tenant=e.tenant, app=e.app, task=e.task, trace_id=e.trace_id, turn_id=e.turn_id,
                              event_time=e.event_time, **rng.choice(DODGE_FEEDBACK)))
    for e in rng.sample(events, 30):                   # exact re-deliveries
        extra.append(e)
    for e in rng.sample(turns, 10):                    # feedback for unknown turns
        extra.append(Feedback(tenant=e.tenant, app=e.app, task=e.task, trace_id=e.trace_id,
                              turn_id="ghost-" + e.turn_id, kind="thumbs", value=1, event_time=e.event_time))
    tenants = sorted({e.tenant for e in events})
    for e in rng.sample(events, 60):                   # the same ids (event, trace, turn) from another tenant
        extra.append(dataclasses.replace(e, tenant=rng.choice([t for t in tenants if t != e.tenant])))
    for e in extra:
        events.insert(rng.randrange(len(events)), e)
    return events


def comparable(rows: list[dict]) -> dict[str, tuple]:
    out = {}
    for r in rows:
        out[(r["tenant"], r["trace_id"], r["turn_id"])] = tuple(round(r[k], 12) if isinstance(r[k], float) else r[k] for k in KEYS)
    return out


def corr_key(rows: list[dict]) -> list[tuple]:
    return sorted((r["tenant"], r["event_id"], r["turn_id"] or "", r["component"] or "", r["reason"],
                   None if r["value"] is None else round(r["value"], 12), r["spec_version"]) for r in rows)


@pytest.mark.parametrize("seed, book", [(11, SpecBook()), (12, CUSTOM), (13, CUSTOM)])
def test_engine_equals_reference_over_incremental_runs(lake_root, seed, book):
    events = traffic(seed, 120)
    cuts = [0, len(events) // 3, 2 * len(events) // 3, len(events)]
    nows = [START + timedelta(minutes=m) for m in (12, 35, 24 * 60)]
    pending: list[dict] = []
    registry: list[dict] = []
    for k in range(3):
        before = delta.version(lake_root, EVENTS)
        land(lake_root, events[cuts[k]:cuts[k + 1]])
        _, files = delta.files(lake_root, EVENTS, after=before)  # what this run landed
        got = run_rewards(lake_root, book, now=nows[k]).tables
        want = reference.compute(reference.read_signals(files), book, nows[k], pending, registry)
        assert comparable(got.settled.to_pylist()) == comparable(want.settled)
        assert comparable(got.provisional.to_pylist()) == comparable(want.provisional)
        assert corr_key(got.corrections.to_pylist()) == corr_key(want.corrections)
        assert sorted(zip(got.pending["tenant"].to_pylist(), got.pending["event_id"].to_pylist())) == \
            sorted((s["tenant"], s["event_id"]) for s in want.pending)
        pending = want.pending
        registry += want.settled
    assert got.settled.num_rows > 0 and len(registry) > 200
    lifted = [r for r in registry if r["dodge"] and r["total"] > book.resolve(r["tenant"], r["task"]).dodge.cap]
    capped = [r for r in registry if r["dodge"] and r["total"] <= book.resolve(r["tenant"], r["task"]).dodge.cap]
    assert lifted and capped                           # both sides of the explicit-positive rule were compared
    hs = [r["hindsight"] for r in registry if r["hindsight"] is not None]
    assert min(hs) < 0 < max(hs)                       # hindsight of both signs was compared
    assert {r["settled"] for r in registry} == {True}


def test_reference_and_engine_disagree_when_the_spec_differs(lake_root):
    """The comparison above can fail: a different spec gives different totals."""
    land(lake_root, generate(40, seed=3, start=START))
    _, files = delta.files(lake_root, EVENTS)
    got = run_rewards(lake_root, SpecBook(), now=START + timedelta(days=1)).tables
    want = reference.compute(reference.read_signals(files), CUSTOM, START + timedelta(days=1))
    assert comparable(got.settled.to_pylist()) != comparable(want.settled)
