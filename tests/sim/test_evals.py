"""Each family's private eval: its held-out prompts, scored like the users judge. The suites are
written by pipelines/sim/evals.py where they are needed (nothing of the simulator's is committed
under evals/), once per module here."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.evals.scorers import score
from pipelines.evals.suites import load_suites
from pipelines.sim.evals import ensure_suite, write_suite, write_suites
from pipelines.sim.families import Reply, families

REPO = Path(__file__).resolve().parents[2]
FAMILIES = [n for n in families() if n != "concise"]  # concise's rubric is stricter than its `liked`


@pytest.fixture(scope="module")
def EVALS(tmp_path_factory):
    return write_suites(tmp_path_factory.mktemp("evals"))

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


@pytest.mark.parametrize("name", list(families()))
def test_written_suite_is_the_families_heldout_prompts(name, tmp_path, EVALS):
    fam = families()[name]
    [suite] = load_suites(EVALS, "acme", fam.task)
    assert suite.role == "primary" and len(suite.items) == len(fam.prompts("heldout"))
    users = [[m for m in i.messages if m["role"] == "user"][-1]["content"] for i in suite.items]
    assert users == [m[-1]["content"] for m in fam.prompts("heldout")]
    train = {m[-1]["content"] for m in fam.prompts("train")}
    assert not train & set(users)
    write_suite(fam, tmp_path)  # writing again gives the same files (deterministic)
    for f in ("toml", "jsonl"):
        assert (tmp_path / "acme" / fam.task / f"{fam.task}.{f}").read_text() == \
            (EVALS / "acme" / fam.task / f"{fam.task}.{f}").read_text()


def test_the_concise_suite_scores_a_short_complete_reply(EVALS):
    """concise's rubric (complete: a full stop; short: 180 characters at most)."""
    [suite] = load_suites(EVALS, "acme", "concise")
    item = suite.items[0]
    assert score(suite.scorer, "Your flight leaves at nine.", item) == 1.0
    assert score(suite.scorer, "Your flight leaves at nine", item) == 0.0       # cut off
    assert score(suite.scorer, "word " * 40 + "end.", item) == 0.0             # too long


def test_no_simulator_suite_is_committed_under_evals():
    """A checkout's evals/ tracks the template only (the simulator's suites are written where a
    demo needs them, and git ignores them there): a fresh clone's `tracerl tenant list` is empty."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "evals"], capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked and all(f.startswith("evals/_template/") or f == "evals/.gitignore" for f in tracked), tracked


def test_ensure_suite_writes_a_missing_simulated_suite_only(tmp_path):
    assert ensure_suite(tmp_path, "acme", "style") == tmp_path / "acme" / "style"
    assert len(load_suites(tmp_path, "acme", "style")[0].items) == len(families()["style"].prompts("heldout"))
    own = tmp_path / "acme" / "fact"
    own.mkdir(parents=True)
    (own / "mine.toml").write_text('role = "primary"\n[scorer]\nkind = "regex"\npattern = "x"\n')
    assert ensure_suite(tmp_path, "acme", "fact") is None                # someone's own suite: left alone
    assert sorted(p.name for p in own.iterdir()) == ["mine.toml"]
    assert ensure_suite(tmp_path, "acme", "support") is None             # no simulated family's task
    assert not (tmp_path / "acme" / "support").exists()


@pytest.mark.parametrize("name", FAMILIES)
def test_primary_scorer_agrees_with_liked(name, EVALS):
    fam = families()[name]
    [suite] = load_suites(EVALS, "acme", fam.task)
    item = suite.items[0]
    verdicts = set()
    for text in REPLIES[name]:
        liked = fam.liked(Reply(text, 20, "stop"))
        verdicts.add(liked)
        assert score(suite.scorer, text, item) == float(liked), text
    assert verdicts == {True, False}


def test_tools_items_carry_the_rendered_tools(EVALS):
    fam = families()["tools"]
    [suite] = load_suites(EVALS, "acme", "tools")
    for item in suite.items:
        assert item.messages[0]["role"] == "system" and "<tools>" in item.messages[0]["content"]
        assert item.extra["tools"] == list(fam.tools)
