"""Each simulated-user family likes what its rule says, on hand-written replies; prompts never leak."""

from __future__ import annotations

import pytest

from pipelines.contract.tool_calls import check_call, parse_tool_calls
from pipelines.sim.env import HiddenPreference
from pipelines.sim.families import Fact, FollowUp, Reply, Style, Tools, families, family


def r(text: str, finish: str = "stop", tokens: int = 20, tool_calls=()) -> Reply:
    return Reply(text, tokens, finish, tuple(tool_calls))


def test_registry_names_and_tasks():
    assert set(families()) >= {"concise", "followup", "fact", "tools", "style"}
    assert isinstance(family("concise"), HiddenPreference)
    assert all(f.name == n for n, f in families().items())
    with pytest.raises(ValueError, match="known: .*followup"):
        family("nope")


@pytest.mark.parametrize("name", sorted(families()))
def test_train_and_heldout_prompts_never_share_a_topic(name):
    fam = family(name)
    train = {m[-1]["content"] for m in fam.prompts("train")}
    held = {m[-1]["content"] for m in fam.prompts("heldout")}
    assert train and held and not train & held
    if hasattr(fam, "topics"):
        held_topics = set(fam.topics[-fam.heldout:])
        assert not any(t in p for t in held_topics for p in train)


def test_concise():
    f = HiddenPreference(max_tokens=10)
    assert f.liked(r("Your order ships today.", tokens=6))
    assert not f.liked(r("Your order ships today.", tokens=11))
    assert not f.liked(r("Your order ships", finish="length", tokens=10))
    assert not f.liked(r("Does it ship today?", tokens=6))


def test_followup_needs_an_answer_then_a_question():
    f = FollowUp()
    assert f.liked(r("Start with a guest list and a budget. What date are you thinking of?"))
    assert f.liked(r("Book early! Trains fill up fast in summer. Do you want hotel tips too?"))
    assert not f.liked(r("What date are you thinking of?"))                   # a bare question
    assert not f.liked(r("Sure! What date?"))                                 # no real answer first
    assert not f.liked(r("Start with a guest list and a budget."))            # no question
    assert not f.liked(r("Start with a guest list and a budget. What date are you", finish="length"))
    # a tail cut off by max_tokens after the question does not count against it
    assert f.liked(r("Start with a guest list and a budget. What date works? I can also", finish="length"))
    assert not f.liked(r("Start with a guest list and a budget. What date works? I can. Then", finish="length"))


def test_fact_needs_a_concrete_turnaround():
    f = Fact()
    for text in ("Refunds are processed within 24 hours.", "It usually takes 3-5 business days.",
                 "Expect an answer in 2 weeks.", "We reply within 48 Hours of your request."):
        assert f.liked(r(text)), text
    for text in ("We will process it as soon as possible.", "It takes a few days.", "Call 24/7 for help."):
        assert not f.liked(r(text)), text


def test_style_needs_a_greeting_first():
    f = Style()
    for text in ("Hi! Our store opens at 9.", "Hello there, the sale ends Sunday.", "Good morning, yes we do.",
                 "Dear customer, thank you."):
        assert f.liked(r(text)), text
    for text in ("Our store opens at 9. Hi!", "Highlights of the collection are...", "Sure, we can help."):
        assert not f.liked(r(text)), text


def test_tools_liked_iff_every_call_is_valid():
    f = Tools()
    ok = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
    assert f.liked(r(ok))
    extra_key = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}]</tool_call>'
    wrong_key = '<tool_call>[{"name": "get_weather", "arguments": {"location": "Paris"}}]</tool_call>'
    unknown = '<tool_call>[{"name": "get_stock", "arguments": {"symbol": "X"}}]</tool_call>'
    broken = '<tool_call>[{"name": "get_weather", "arguments": {"city": </tool_call>'
    for text in (extra_key, wrong_key, unknown, broken, "It is sunny in Paris.", ok + wrong_key):
        assert not f.liked(r(text)), text
    # structured calls as the gateway returns them count the same as the text
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}}
    assert f.liked(r("", tool_calls=[call]))


def test_the_tools_app_forces_its_tool_and_the_model_reads_the_call_opened():
    """The app sends tool_choice naming its one tool; what the model reads (served and in the
    evals) ends with the call opened up to its arguments, as the gateway serves it."""
    from pipelines.contract.tool_calls import call_prefix
    from pipelines.sim.families import TOOLS, model_input

    f = Tools()
    assert f.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    [m] = f.prompts("heldout")[:1]
    served = model_input(f, m)
    assert served[-1] == {"role": "assistant", "content": call_prefix(f.tool_choice)} and served[-2] == m[-1]
    harder = Tools(tools=TOOLS, forced_tool=None)  # the model picks a tool, or answers
    assert harder.tool_choice is None and model_input(harder, m)[-1] == m[-1]
    with pytest.raises(ValueError, match="forced_tool='get_stock' is not one of the tools sent"):
        Tools(forced_tool="get_stock")


def test_tools_outcomes_are_what_the_app_would_see():
    f = Tools()
    [good] = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>').calls
    [nowhere] = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": "Atlantis"}}'
                                 '</tool_call>').calls
    [invalid] = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>').calls
    assert f.run_tool(good) == ("ok", None)
    assert f.run_tool(nowhere)[0] == "error"
    assert f.run_tool(invalid)[0] == "invalid_arguments" and check_call(invalid, list(f.tools)) is not None


@pytest.mark.parametrize("bad,match", [(dict(min_answer_words=0), "min_answer_words=0"),
                                       (dict(heldout=0), "heldout=0")])
def test_followup_validates(bad, match):
    with pytest.raises(ValueError, match=match):
        FollowUp(**bad)


def test_pattern_families_validate():
    with pytest.raises(ValueError, match="does not compile"):
        Fact(pattern="(")
    with pytest.raises(ValueError, match="does not compile"):
        Style(pattern="[")
