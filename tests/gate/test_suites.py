"""Suite files, hashing with normalization, learner exclusion, decisions, config errors."""

import json
from pathlib import Path

import pytest

from pipelines.config.gate import GateConfig
from pipelines.evals.contamination import eval_hashes, exclude_eval_turns, find_contamination
from pipelines.gate.decide import HOLD, PROMOTE, REJECT, decide, judge_suite
from pipelines.gate.stats import paired_bootstrap
from pipelines.evals.suites import load_suite, load_suites
from pipelines.evals.hashing import prompt_hash

REPO = Path(__file__).resolve().parents[2]


def test_every_shipped_suite_parses():
    suites = load_suites(REPO / "docs" / "examples" / "evals", "example", "support")
    assert {s.name: s.role for s in suites} == {"correctness": "primary", "format": "guardrail", "tools": "guardrail"}
    assert all(s.items for s in suites)


def test_hash_ignores_case_and_whitespace_but_not_roles_or_words():
    a = [{"role": "user", "content": "What is  the capital of FRANCE?"}]
    assert prompt_hash(a) == prompt_hash([{"role": "user", "content": " what is the capital of france? "}])
    assert prompt_hash(a) != prompt_hash([{"role": "system", "content": "What is the capital of France?"}])
    assert prompt_hash(a) != prompt_hash([{"role": "user", "content": "What is the capital of Spain?"}])


def write_suite(folder: Path, name: str, toml: str, items: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(toml)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    return folder / f"{name}.toml"


@pytest.mark.parametrize("toml,items,words", [
    ('role = "boss"\n[scorer]\nkind = "exact"', [{"messages": [{"role": "user", "content": "a"}]}], "role='boss'"),
    ('tolerance = 2\n[scorer]\nkind = "exact"', [{"messages": [{"role": "user", "content": "a"}]}], "tolerance=2.0"),
    ('role = "primary"', [{"messages": [{"role": "user", "content": "a"}]}], r"no \[scorer\]"),
    ('[scorer]\nkind = "exact"', [{"messages": "hi"}], "non-empty list"),
    ('[scorer]\nkind = "exact"', [{"messages": [{"role": "user", "content": "A"}]},
                                  {"messages": [{"role": "user", "content": "a "}]}], "duplicate prompt"),
    ('colour = 1\n[scorer]\nkind = "exact"', [{"messages": [{"role": "user", "content": "a"}]}], "unknown keys"),
])
def test_bad_suites_are_clear_errors(tmp_path, toml, items, words):
    with pytest.raises(ValueError, match=words):
        load_suite(write_suite(tmp_path, "s", toml, items))


def test_learner_excludes_eval_turns_by_normalized_hash():
    hashes = eval_hashes(REPO / "docs" / "examples" / "evals", "example", "support")
    turns = [
        {"id": 1, "m": [{"role": "user", "content": "how many DAYS are in a week?"}]},           # eval, recased
        {"id": 2, "m": [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "How many days are in a week?"}]},            # eval under a new system prompt
        {"id": 3, "m": [{"role": "user", "content": "How many hours are in a day?"}]},
    ]
    kept, excluded = exclude_eval_turns(turns, hashes, messages=lambda t: t["m"])
    assert [t["id"] for t in kept] == [3] and [t["id"] for t in excluded] == [1, 2]
    assert len(find_contamination([t["m"] for t in turns], hashes)) == 2
    assert len(eval_hashes(REPO / "evals", "nobody", "nothing")) == 0


def verdict(role, cand, champ, gate, tolerance=0.0):
    return judge_suite(role, role, tolerance, paired_bootstrap(cand, champ, gate.confidence, 2000, 0), gate)


def test_decision_promote_reject_guardrail_and_hold():
    gate = GateConfig()
    gain, flat = ([1.0] * 30, [0.0] * 10 + [1.0] * 20), ([1.0] * 30, [1.0] * 30)
    d = decide([verdict("primary", *gain, gate), verdict("guardrail", *flat, gate)], gate)
    assert d.outcome == PROMOTE and d.passed
    d = decide([verdict("primary", *flat, gate)], gate)
    assert d.outcome == REJECT and "no significant gain" in d.reasons[0]
    drop = ([0.0] * 6 + [1.0] * 24, [1.0] * 30)
    d = decide([verdict("primary", *gain, gate), verdict("guardrail", *drop, gate, tolerance=0.05)], gate)
    assert d.outcome == REJECT and "regression beyond tolerance" in d.reasons[0]
    small = ([0.0] * 1 + [1.0] * 29, [1.0] * 30)  # a drop of 1/30 can exceed 0.05 in the bootstrap tail
    assert not verdict("guardrail", *small, gate, tolerance=0.05).passed
    assert verdict("guardrail", *small, gate, tolerance=0.2).passed
    review = GateConfig(review=True)
    assert decide([verdict("primary", *gain, review)], review).outcome == HOLD
    assert decide([verdict("guardrail", *flat, gate)], gate).outcome == REJECT  # no primary suite


def test_kl_budget():
    gate = GateConfig(max_kl=0.5)
    gain = verdict("primary", [1.0] * 30, [0.0] * 10 + [1.0] * 20, gate)
    assert decide([gain], gate, kl=0.08).outcome == PROMOTE
    assert decide([gain], gate, kl=None).outcome == PROMOTE  # not recorded: said in the reasons
    assert "not checked" in [r for r in decide([gain], gate, kl=float("nan")).reasons if "KL" in r][0]
    d = decide([gain], gate, kl=1.0)
    assert d.outcome == REJECT and "gate.max_kl=0.5" in d.reasons[0]
    assert decide([gain], GateConfig(max_kl=None), kl=5.0).outcome == PROMOTE


@pytest.mark.parametrize("kw,words", [
    ({"test": "t"}, "gate.test='t'"), ({"confidence": 1.0}, "confidence=1.0"),
    ({"n_bootstrap": 10}, "n_bootstrap=10"), ({"max_kl": 0}, "max_kl=0"), ({"samples_per_item": 4, "temperature": 0.0}, "temperature=0"),
])
def test_gate_config_rejects_bad_values(kw, words):
    with pytest.raises(ValueError, match=words):
        GateConfig(**kw)
