"""The gate against a real MLflow server + registry (SQLite): pass, reject, guardrail regression,
contamination, review hold then approval, rollback. vLLM is replaced by a scripted backend here
(test_gate_vllm.py serves real adapters)."""

import time

import pytest

from pipelines.adapters import promote as reg
from pipelines.evals.contamination import ContaminationError
from pipelines.gate.run import run_gate
from pipelines.adapters.registry import CHALLENGER, CHAMPION, adapter_for_alias, model_name
from pipelines.tracking import client
from tests.gate.gate_fixtures import FakeBackend, candidate, policy_for, question, setup


def tags_of(cfg, tenant, task, version):
    return client(cfg).get_model_version(model_name(tenant, task), version).tags


def test_pass_promotes_and_logs_only_aggregates_and_hashes(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv, av = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av: (3, True)}, tenant, task))  # base: quality 1
    r = run_gate(cfg, tenant, task, rv, backend=backend, gate=gate, training_prompts=[])
    assert r.decision.outcome == "promote" and r.baseline == "base", r.decision.reasons
    assert adapter_for_alias(cfg, tenant, task, CHAMPION) == av
    tags = tags_of(cfg, tenant, task, rv)
    assert tags[reg.DECISION] == "promote" and tags[reg.STATUS] == reg.PROMOTED
    assert tags["adapter_version"] == str(av) and tags["tracerl.gate.run_id"] == r.run_id
    assert not any(k.startswith(("eval.", "signature.")) for k in tags)  # numbers: the run's metrics
    # scores, power and behaviour signatures: the run's metrics (and its description)
    metrics = client(cfg).get_run(r.run_id).data.metrics
    assert metrics["answers.candidate"] == 1.0 and metrics["answers.champion"] == pytest.approx(1 / 3, abs=1e-3)
    assert metrics["style.passed"] == 1.0
    assert metrics["answers.mde"] == pytest.approx(r.decision.verdicts[0].mde, abs=1e-6)
    assert r.decision.verdicts[0].mde > 0.15
    assert "can only detect gains" in tags["tracerl.gate.reasons"]  # the warning, among the reasons
    assert metrics["signature.refusal.candidate"] == 0.0 and metrics["signature.tool_error.blocked"] == 0.0
    assert {"answers.mde", "answers.mde_observed", "signature.length.candidate",
            "signature.clarify.champion"} <= set(metrics)
    # identical requests for both: same items, sampling and seeds
    by_model = {}
    for name, text, sampling, seed in backend.calls:
        by_model.setdefault(name, set()).add((text, sampling, seed))
    assert len(by_model) == 2 and len(set(map(frozenset, by_model.values()))) == 1
    # private: no prompt or reference text in the version tags, run params/tags/metrics or artifacts
    c = client(cfg)
    run = c.get_run(r.run_id)
    artifacts = {a.path for a in c.list_artifacts(r.run_id, "gate")}
    assert artifacts >= {"gate/decision.json", "gate/item_scores.json", "gate/scores_by_version.png"}
    # the reviewer's page: the decision, its reasons and a link to this run, first on the version
    mv = c.get_model_version(model_name(tenant, task), rv)
    assert mv.description.startswith("## Gate\n\n**promote** against the base model, by [gate v1 vs base]"
                                      f"(#/experiments/{run.info.experiment_id}/runs/{r.run_id}"
                                      "?workflowType=machine_learning)")
    assert all(f"- {reason}" in mv.description for reason in r.decision.reasons)
    assert "| answers | primary | 30 | 1.000 | 0.333 | +0.667 |" in mv.description
    assert run.info.run_name == f"gate {tenant}/{task} v1 vs base"
    assert c.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    texts = [str(tags), str(run.data.params), str(run.data.tags), str(run.data.metrics), mv.description]
    local = c.download_artifacts(r.run_id, "gate", str(tmp_path / "dl"))
    texts += [p.read_text() for p in (tmp_path / "dl" / "gate").glob("*.json")]
    assert local
    for blob in texts:
        assert "Private question" not in blob and "secret-" not in blob and "Style prompt" not in blob


def test_no_significant_gain_is_rejected_with_reasons(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv1, av1 = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av1: (2, True)}, tenant, task))
    assert run_gate(cfg, tenant, task, rv1, backend=backend, gate=gate, training_prompts=[]).decision.outcome == "promote"
    rv2, av2 = candidate(cfg, tenant, task, parent=av1)
    backend.policies.update(policy_for({av2: (2, True)}, tenant, task))  # as good as the champion
    before = time.time()
    r = run_gate(cfg, tenant, task, rv2, backend=backend, gate=gate, training_prompts=[])
    assert r.decision.outcome == "reject" and r.baseline == rv1
    assert any("no significant gain" in x for x in r.decision.reasons)
    assert adapter_for_alias(cfg, tenant, task, CHAMPION) == av1
    assert tags_of(cfg, tenant, task, rv2)[reg.STATUS] == reg.REJECTED
    assert "primary suite 'answers'" in tags_of(cfg, tenant, task, rv2)["tracerl.gate.reasons"]
    c = client(cfg)
    run = c.get_run(r.run_id)
    assert run.info.run_name == f"gate {tenant}/{task} v{rv2} vs v{rv1}"
    # the run spans the gate's work (sampling both models), not only its logging
    assert -0.01 < run.info.start_time / 1000 - before < 0.25 and run.info.end_time / 1000 <= time.time()
    desc = c.get_model_version(model_name(tenant, task), rv2).description
    assert f"**reject** against champion v{rv1}" in desc and "no significant gain" in desc


def test_guardrail_regression_rejects_despite_a_primary_gain(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv, av = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av: (3, False)}, tenant, task))  # right answers, no full stop
    r = run_gate(cfg, tenant, task, rv, backend=backend, gate=gate, training_prompts=[])
    assert r.decision.outcome == "reject"
    assert [v.passed for v in r.decision.verdicts] == [True, False]
    assert "guardrail suite 'style'" in r.decision.reasons[0] and "beyond tolerance" in r.decision.reasons[0]
    assert adapter_for_alias(cfg, tenant, task, CHAMPION) is None


def test_kl_budget_rejects_an_over_optimized_candidate(tmp_path, mlflow_server):
    """docs/measured.md: at lr 5e-4 the hidden preference is met and answers collapse (KL ~1.0)."""
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv, av = candidate(cfg, tenant, task, kl=1.0)
    backend = FakeBackend(policy_for({av: (3, True)}, tenant, task))
    r = run_gate(cfg, tenant, task, rv, backend=backend, gate=gate, training_prompts=[])
    assert r.decision.outcome == "reject" and [v.passed for v in r.decision.verdicts] == [True, True]
    blocking = [x for x in r.decision.reasons if not x.startswith("warning: ")]
    assert blocking == ["KL to base 1.0000 > gate.max_kl=0.5: drifted too far (over-optimization)"]
    # the 30-item primary is underpowered: said, with its numbers, but not what rejected it
    assert r.decision.warnings == [x[len("warning: "):] for x in r.decision.reasons if x.startswith("warning: ")]
    assert "suite answers (n=30, 1 sample/item) can only detect gains >= 0.30" in r.decision.warnings[0]


def test_contamination_fails_loudly_and_tags_the_version(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv, av = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av: (3, True)}, tenant, task))
    trained = [[{"role": "user", "content": "hello"}], [{"role": "user", "content": question(7).upper()}]]
    with pytest.raises(ContaminationError, match="1 eval item"):
        run_gate(cfg, tenant, task, rv, backend=backend, gate=gate, training_prompts=trained)
    tags = tags_of(cfg, tenant, task, rv)
    assert tags[reg.DECISION] == "reject" and tags[reg.STATUS] == reg.REJECTED
    assert "contamination" in tags["tracerl.gate.reasons"] and len(tags["tracerl.gate.contamination"]) == 64
    assert backend.calls == [] and adapter_for_alias(cfg, tenant, task, CHAMPION) is None


def test_review_holds_until_a_person_approves_then_deploys(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server, review=True)
    rv, av = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av: (3, True)}, tenant, task))
    r = run_gate(cfg, tenant, task, rv, backend=backend, gate=gate, training_prompts=[])
    assert r.decision.outcome == "hold" and r.passed
    assert adapter_for_alias(cfg, tenant, task, CHALLENGER) == av
    assert adapter_for_alias(cfg, tenant, task, CHAMPION) is None
    deployed = []
    deploy = lambda *a: deployed.append(a)  # noqa: E731
    assert reg.promote_approved(cfg, tenant, task, gate.approval_tag, deploy) == []  # nobody approved yet
    client(cfg).set_model_version_tag(model_name(tenant, task), rv, gate.approval_tag, "true")  # the UI does this
    done = reg.promote_approved(cfg, tenant, task, gate.approval_tag, deploy)
    assert [d["champion"] for d in done] == [rv] and deployed == [(tenant, task, av)]
    assert adapter_for_alias(cfg, tenant, task, CHAMPION) == av
    assert adapter_for_alias(cfg, tenant, task, CHALLENGER) is None
    assert reg.promote_approved(cfg, tenant, task, gate.approval_tag, deploy) == []  # once only


def test_rollback_moves_champion_back_and_redeploys(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv1, av1 = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av1: (2, True)}, tenant, task))
    deployed = []
    deploy = lambda *a: deployed.append(a)  # noqa: E731
    run_gate(cfg, tenant, task, rv1, backend=backend, gate=gate, training_prompts=[], deploy=deploy)
    rv2, av2 = candidate(cfg, tenant, task, parent=av1)
    backend.policies.update(policy_for({av2: (3, True)}, tenant, task))
    r = run_gate(cfg, tenant, task, rv2, backend=backend, gate=gate, training_prompts=[], deploy=deploy)
    assert r.decision.outcome == "promote" and r.baseline == rv1
    assert deployed == [(tenant, task, av1), (tenant, task, av2)]
    out = reg.rollback(cfg, tenant, task, deploy)
    assert out["champion"] == rv1 and deployed[-1] == (tenant, task, av1)
    assert adapter_for_alias(cfg, tenant, task, CHAMPION) == av1
    assert tags_of(cfg, tenant, task, rv2)[reg.STATUS] == reg.ROLLED_BACK
    with pytest.raises(reg.RegistryError, match="replaced nothing"):
        reg.rollback(cfg, tenant, task, deploy)


def test_a_failed_deploy_leaves_the_champion_alone(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv, av = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av: (3, True)}, tenant, task))

    def broken(*a):
        raise RuntimeError("vLLM refused the adapter")

    with pytest.raises(RuntimeError, match="refused"):
        run_gate(cfg, tenant, task, rv, backend=backend, gate=gate, training_prompts=[], deploy=broken)
    assert adapter_for_alias(cfg, tenant, task, CHAMPION) is None


class Noisy(FakeBackend):
    """Sampled replies: item i is answered right with the model's probability, drawn from its seed
    and the model's side (candidate or champion; not the per-test tenant name, so runs repeat)."""

    def generate(self, name, messages, sampling, seed):
        import random

        self.calls.append((name, messages[0]["content"], sampling, seed))
        text = messages[0]["content"]
        q = self.policies.get(name, (0.45,))[0] if "number" in text else 1.0
        return ("It is secret-" + text.split("number ")[1].split(":")[0]
                if "number" in text and random.Random(f"{name.startswith('gate.')}|{seed}").random() < q
                else "I do not know") + "."


def test_sequential_looks_sample_more_with_new_seeds_for_both_models(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server, temperature=0.8)
    rv, av = candidate(cfg, tenant, task)
    backend = Noisy(policy_for({av: (0.7,)}, tenant, task))   # vs the base's 0.45
    r = run_gate(cfg, tenant, task, rv, backend=backend, gate=gate, training_prompts=[])
    v = r.decision.verdicts[0]
    # seeded, so it repeats: +0.10 at look 1 and +0.20 at look 2 are not significant, +0.27 on 4 samples is
    assert [(x.samples, x.action) for x in v.looks] == [(1, "continue"), (2, "continue"), (4, "significant")], v.reason
    assert v.samples == 4 and r.decision.outcome == "promote", r.decision.reasons
    assert all(x.alpha == pytest.approx(0.05 / 3) for x in v.looks) and "Bonferroni" in v.reason
    asked = {}
    for name, text, _, seed in backend.calls:
        if "number" in text:
            asked.setdefault(name, []).append((text, seed))
    assert len(asked) == 2 and sorted(asked[next(iter(asked))]) == sorted(list(asked.values())[1])
    per_item = {}
    for text, seed in next(iter(asked.values())):
        per_item.setdefault(text, set()).add(seed)
    assert all(len(seeds) == v.samples for seeds in per_item.values())   # new seeds, no repeats
    assert client(cfg).get_run(r.run_id).data.metrics["answers.looks"] == len(v.looks)


def test_the_reviewer_gets_side_by_side_replies_to_recent_real_prompts_never_eval_items(tmp_path, mlflow_server):
    """gate/side_by_side.json on the gate run: the target's latest distinct production prompts
    (an eval item's question sent live is left out, duplicates once), each answered by candidate
    and champion with the same seed, scored by the primary scorer where it can score them."""
    import json

    from pipelines.contract.events import Message, ModelTurn
    from pipelines.config.gate import GateConfig
    from pipelines.evals.suites import load_suites
    from pipelines.gate.side_by_side import side_by_side
    from tests.reward.reward_lake import at, land

    cfg, gate, tenant, task = setup(tmp_path, mlflow_server, side_by_side=3)
    asked = ["Real question A?", question(4), "Real question B?", "Real question B?", "Real question C?",
             "Real question D?"]  # oldest first: D is the latest, question(4) is an eval item
    land(cfg.lake, [ModelTurn(tenant=tenant, app="bot", task=task, trace_id=f"tr{i}", turn_id=f"u{i}", turn_index=0,
                              event_time=at(i), model="m", input_messages=[Message(role="user", content=q)],
                              output_text="x") for i, q in enumerate(asked)])
    rv, av = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av: (3, True)}, tenant, task))
    r = run_gate(cfg, tenant, task, rv, backend=backend, gate=gate, training_prompts=[])
    path = client(cfg).download_artifacts(r.run_id, "gate/side_by_side.json", str(tmp_path / "dl"))
    table = json.loads(open(path).read())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [x["prompt"] for x in rows] == ["Real question D?", "Real question C?", "Real question B?"]
    assert all(x["candidate"] == x["champion"] == "It is secret-0." for x in rows)  # FakeBackend's reply
    assert all(x["candidate_score"] is None for x in rows)  # the primary regex needs each item's own pattern
    asked_live = {m for _, m, _, _ in backend.calls}
    assert "Real question A?" not in asked_live and {x["prompt"] for x in rows} <= asked_live
    # a scorer that can score any reply does: the guardrail's "ends with a period"
    style = next(s for s in load_suites(gate.suites_dir, tenant, task) if s.name == "style")
    cols = side_by_side(FakeBackend({"a": (1, True), "b": (1, False)}), "a", "b",
                        [[{"role": "user", "content": "Real question D?"}]], style, GateConfig(temperature=0.0,
                                                                                             samples_per_item=1))
    assert (cols["candidate_score"], cols["champion_score"]) == ([1.0], [0.0])


def test_a_description_section_is_replaced_in_place_and_the_others_kept(tmp_path, mlflow_server):
    from pipelines.adapters.registry import describe

    cfg, _, tenant, task = setup(tmp_path, mlflow_server)
    rv, _ = candidate(cfg, tenant, task)
    describe(cfg, tenant, task, rv, "Learner", "trained on 40 turns")
    describe(cfg, tenant, task, rv, "Gate", "**reject**\n\n- no gain")
    assert describe(cfg, tenant, task, rv, "Learner", "trained on 41 turns") == \
        "## Learner\n\ntrained on 41 turns\n\n## Gate\n\n**reject**\n\n- no gain\n"
    assert client(cfg).get_model_version(model_name(tenant, task), rv).description.startswith("## Learner\n\ntrained on 41")


def test_the_champion_is_not_asked_again_what_it_was_asked_as_a_candidate(tmp_path, mlflow_server):
    """v1 is gated against the base, promoted; v2 against v1: v1's replies come from v1's own gate
    (same items, sampling and seeds), so the second gate generates for v2 alone, and decides as
    it would have with v1 asked again."""
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server, temperature=1.0, samples_per_item=2)
    rv1, av1 = candidate(cfg, tenant, task)
    rv2, av2 = candidate(cfg, tenant, task, parent=av1)
    policies = policy_for({av1: (2, True), av2: (3, True)}, tenant, task)
    first = FakeBackend(policies)
    assert run_gate(cfg, tenant, task, rv1, backend=first, gate=gate, training_prompts=[]).decision.outcome == "promote"
    v1_asked = {(t, s) for n, t, _, s in first.calls if n.endswith(f"v{av1}")}
    second = FakeBackend(policies)
    r = run_gate(cfg, tenant, task, rv2, backend=second, gate=gate, training_prompts=[])
    assert {n for n, *_ in second.calls} == {f"gate.{tenant}.{task}.v{av2}"}   # v1 was not asked at all
    assert r.reused == {"candidate": 0, "champion": len(second.calls)} and len(second.calls) > 0
    assert {(t, s) for _, t, _, s in second.calls} == v1_asked              # the same items and seeds
    # v1's kept replies score as v1 does (quality 2: two items in three right)
    assert r.decision.verdicts[0].stats.champion_mean == pytest.approx(2 / 3, abs=0.02)
    assert r.decision.outcome == "promote"
    metrics = client(cfg).get_run(r.run_id).data.metrics
    assert metrics["reused_replies.champion"] == r.reused["champion"]


def test_one_tenants_kept_replies_are_never_read_by_another_tenants_gate(tmp_path, mlflow_server):
    """Two tenants on the same base with the same eval items: the second tenant's gate asks the
    base itself (its private replies stay its own), and its decision follows its own backend."""
    cfg, gate, a, task = setup(tmp_path, mlflow_server)
    rv, _ = candidate(cfg, a, task)
    assert run_gate(cfg, a, task, rv, backend=FakeBackend({}), gate=gate, training_prompts=[]).reused == \
        {"candidate": 0, "champion": 0}
    b = "b" + a[1:]
    from tests.gate.gate_fixtures import write_suites
    write_suites(tmp_path / "evals", b, task)
    rv_b, av_b = candidate(cfg, b, task)
    backend = FakeBackend(policy_for({av_b: (3, True)}, b, task), default=(0, True))
    r = run_gate(cfg, b, task, rv_b, backend=backend, gate=gate, training_prompts=[])
    assert r.reused == {"candidate": 0, "champion": 0}
    assert cfg.serve.served_model_name in {n for n, *_ in backend.calls}   # the base was asked again
    assert r.decision.outcome == "promote"
