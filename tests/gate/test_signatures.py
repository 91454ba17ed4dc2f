"""Behaviour signatures on synthetic replies: the classifiers, the tests, and the decision they block."""

import json

import pytest

from pipelines.contract.behaviour import classify, is_clarify, is_refusal, tool_use
from pipelines.config.gate import GateConfig, SignatureConfig
from pipelines.gate.decide import PROMOTE, REJECT, decide, judge_suite
from pipelines.gate.signatures import compare_signatures, fisher_greater, mcnemar_greater
from pipelines.gate.stats import paired_bootstrap

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}]
GOOD = json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}})
BAD_ARGS = '<tool_call>[{"name": "get_weather", "arguments": {"town": 3}}]</tool_call>'
BROKEN_JSON = '{"name": "get_weather", "arguments": {"city": "Os'
ANSWER = "The weather in Oslo is mild today, around 12 degrees."


def test_classifiers():
    assert tool_use(GOOD, TOOLS) == tool_use(GOOD, TOOLS) and not tool_use(GOOD, TOOLS).broken
    assert tool_use(GOOD, TOOLS).attempted
    bad = tool_use(BAD_ARGS, TOOLS)
    assert bad.attempted and bad.broken and "city" in bad.reason
    assert tool_use(BROKEN_JSON, TOOLS).broken          # starts like a bare call, does not parse
    assert tool_use('{"name": "rm_rf", "arguments": {}}', TOOLS).broken  # a tool nobody offered
    assert not tool_use('{"name": "rm_rf", "arguments": {}}', None).broken  # no tools: only well-formedness
    assert not tool_use(ANSWER, TOOLS).attempted
    assert is_clarify("Which city do you mean?", False) and is_clarify("Which city?  \n", False)
    assert not is_clarify("Which city?", True)           # a call is not a dodge
    assert not is_clarify("x" * 300 + "?", False)        # long: an answer that ends with a question
    # an answer, then a follow-up question: the user got the answer (users may like these)
    assert not is_clarify("Pack light layers and book early. Would you like a packing list?", False)
    assert not is_clarify("Sure! Which city do you mean?", False)
    assert is_clarify("Do you mean the 3.5 or the 4.0 version?", False)
    assert is_refusal("I'm sorry, I can't help with that.") and is_refusal("As an AI, I do not browse.")
    assert is_refusal("I cannot do that") and not is_refusal(ANSWER) and not is_refusal("I can do that.")
    assert classify(ANSWER).chars == len(ANSWER)


def test_exact_tests():
    assert fisher_greater(5, 10, 0, 10) == pytest.approx(0.016254, abs=1e-6)  # the classic one-sided value
    assert fisher_greater(0, 10, 5, 10) == 1.0 and fisher_greater(1, 0, 1, 5) == 1.0
    assert mcnemar_greater([True] * 6 + [False] * 4, [False] * 10) == pytest.approx(1 / 64)


def replies(n, **share):
    """n replies: the first share[kind] * n of each kind (broken, clarify, refusal), the rest answers."""
    texts = []
    for kind, text in (("broken", BAD_ARGS), ("good", GOOD), ("clarify", "Which city?"),
                       ("refusal", "I'm sorry, I can't help with that.")):
        texts += [text] * round(share.get(kind, 0) * n)
    texts += [ANSWER] * (n - len(texts))
    return [classify(t, TOOLS) for t in texts]


def by_name(verdicts):
    return {v.name: v for v in verdicts}


def test_a_significant_rise_of_broken_calls_blocks_and_a_small_one_does_not():
    cfg = SignatureConfig()
    champ = replies(200, good=0.3, broken=0.05)
    worse = replies(200, good=0.1, broken=0.25)      # same attempts, broken 0.05 -> 0.25
    v = by_name(compare_signatures(worse, champ, cfg, alpha=0.05))
    assert v["tool_error"].blocked and v["broken_call"].blocked
    assert v["tool_error"].candidate == pytest.approx(50 / 70) and v["tool_error"].champion == pytest.approx(10 / 70)
    assert "signature tool_error" in v["tool_error"].reason and "0.143" in v["tool_error"].reason
    assert not v["clarify"].blocked and not v["refusal"].blocked and not v["length"].blocked
    # +0.03 is within tolerance even though 200 pairs could show it
    slight = replies(200, good=0.3, broken=0.08)
    assert not by_name(compare_signatures(slight, champ, cfg, 0.05))["broken_call"].blocked
    # a large rise on a handful of replies is not significant: no block on noise
    few = by_name(compare_signatures(replies(4, broken=0.5), replies(4), cfg, 0.05))
    assert few["broken_call"].candidate == 0.5 and not few["broken_call"].blocked
    # None = measured, never blocking
    off = SignatureConfig(tool_error=None, broken_call=None)
    assert not any(x.blocked for x in compare_signatures(worse, champ, off, 0.05))


def test_clarify_refusal_and_length_signatures():
    cfg = SignatureConfig()
    champ = replies(100)
    v = by_name(compare_signatures(replies(100, clarify=0.3), champ, cfg, 0.05))
    assert v["clarify"].blocked and "signature clarify" in v["clarify"].reason
    assert not v["length"].blocked  # 30% short replies: ratio 0.77, within [0.5, 2]
    short = by_name(compare_signatures(replies(100, clarify=0.9), champ, cfg, 0.05))["length"]
    assert short.blocked and "shorter" in short.reason
    v = by_name(compare_signatures(replies(100, refusal=0.2), champ, cfg, 0.05))
    assert v["refusal"].blocked and not v["clarify"].blocked
    long = [classify(ANSWER * 3, TOOLS) for _ in range(100)]
    v = by_name(compare_signatures(long, champ, cfg, 0.05))["length"]
    assert v.blocked and "longer" in v.reason and v.candidate == pytest.approx(3 * len(ANSWER))
    ok = [classify(ANSWER * 2, TOOLS) for _ in range(100)]   # ratio ~2.0: on the limit, not beyond it
    assert not by_name(compare_signatures(ok, champ, cfg, 0.05))["length"].blocked
    with pytest.raises(ValueError, match="paired"):
        compare_signatures(champ[:3], champ, cfg, 0.05)


def test_a_blocked_signature_rejects_a_candidate_that_wins_its_primary():
    gate = GateConfig()
    win = judge_suite("s", "primary", 0.0, paired_bootstrap([1.0] * 200, [0.0] * 60 + [1.0] * 140), gate)
    sigs = compare_signatures(replies(200, broken=0.3), replies(200, broken=0.05), gate.signatures, 0.05)
    d = decide([win], gate, signatures=sigs)
    assert win.passed and d.outcome == REJECT
    assert any(r.startswith("signature broken_call") and "blocked" in r for r in d.reasons)
    clean = compare_signatures(replies(200, broken=0.05), replies(200, broken=0.05), gate.signatures, 0.05)
    d = decide([win], gate, signatures=clean)
    assert d.outcome == PROMOTE and any(r.startswith("signature tool_error") for r in d.reasons)


@pytest.mark.parametrize("kw,words", [({"tool_error": 1.5}, "tool_error=1.5"), ({"length_ratio_min": 2.0}, "length_ratio_min"),
                                      ({"clarify_max_chars": 0}, "clarify_max_chars=0")])
def test_signature_config_is_validated(kw, words):
    with pytest.raises(ValueError, match=words):
        SignatureConfig(**kw)
