"""Each family's private eval: its held-out prompts, scored like the users judge."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.evals.scorers import score
from pipelines.evals.suites import load_suites
from pipelines.sim.evals import write_suite
from pipelines.sim.families import Reply, families

EVALS = Path(__file__).resolve().parents[2] / "evals"
FAMILIES = [n for n in families() if n != "concise"]

REPLIES = {
    "followup": ["Start with a guest list and a budget. What date are you thinking of?",
                 "Book early! Trains fill up fast in summer and prices rise. Do you want hotel tips too?",
                 "What date are you thinking of?", "Sure! What date?", "Start with a guest list and a budget.",
                 "Pack light. Bring a map. Rent a car if you can, it helps a lot. Ready?",
                 "Start with a guest list and a budget. What date works? I can also",
                 "Start with a guest list and a budget. What date works? I can. Then"],
    "fact": ["Refunds are processed within 24 hours.", "It usually takes 3-5 business days.",
             "We will process it as soon as possible.", "It takes a few days.", "Call us 24/7."],
    "style": ["Hi! Our store opens at 9.", "Hello there, the sale ends Sunday.", "Our store opens at 9. Hi!",
              "Highlights of the collection are new.", "Dear customer, thank you."],
    "tools": ['<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>',
              '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}]</tool_call>',
              '{"name": "get_weather", "arguments": {"city": "Oslo"}}', "It is sunny.",
              '<tool_call>[{"name": "get_weather", "arguments": {"location": "Oslo"}}]</tool_call>'],
}


@pytest.mark.parametrize("name", FAMILIES)
def test_committed_suite_is_the_families_heldout_prompts(name, tmp_path):
    fam = families()[name]
    [suite] = load_suites(EVALS, "acme", fam.task)
    assert suite.role == "primary" and len(suite.items) == len(fam.prompts("heldout"))
    users = [[m for m in i.messages if m["role"] == "user"][-1]["content"] for i in suite.items]
    assert users == [m[-1]["content"] for m in fam.prompts("heldout")]
    train = {m[-1]["content"] for m in fam.prompts("train")}
    assert not train & set(users)
    write_suite(fam, tmp_path)  # regenerating gives the committed files (no drift)
    for f in ("toml", "jsonl"):
        assert (tmp_path / "acme" / fam.task / f"{fam.task}.{f}").read_text() == \
            (EVALS / "acme" / fam.task / f"{fam.task}.{f}").read_text()


@pytest.mark.parametrize("name", FAMILIES)
def test_primary_scorer_agrees_with_liked(name):
    fam = families()[name]
    [suite] = load_suites(EVALS, "acme", fam.task)
    item = suite.items[0]
    verdicts = set()
    for text in REPLIES[name]:
        liked = fam.liked(Reply(text, 20, "stop"))
        verdicts.add(liked)
        assert score(suite.scorer, text, item) == float(liked), text
    assert verdicts == {True, False}


def test_tools_items_carry_the_rendered_tools():
    fam = families()["tools"]
    [suite] = load_suites(EVALS, "acme", "tools")
    for item in suite.items:
        assert item.messages[0]["role"] == "system" and "<tools>" in item.messages[0]["content"]
        assert item.extra["tools"] == list(fam.tools)
