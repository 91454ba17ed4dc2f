"""What a reviewer reads in MLflow and Dagster after a gate (issue #43): the gate run's description,
a registry version's few tags, the side-by-side table, the plots' axes, the learner's counts and
rounded metadata. A real MLflow server (conftest.py) and a scripted backend in place of vLLM."""

from __future__ import annotations

import json

from pipelines.adapters import promote as reg
from pipelines.adapters.registry import VERSION_TAGS, model_name, register_candidate
from pipelines.gate import review
from pipelines.gate.run import run_gate
from pipelines.tracking import client
from tests.gate.gate_fixtures import FakeBackend, candidate, policy_for, setup

LONG = ("A long reply from the candidate, as a reviewer must read it whole: " + "and it goes on, " * 30
        + "to the very last word: FIN.")


class Talkative(FakeBackend):
    """FakeBackend, but a real (non-eval) prompt gets a long reply from the candidate."""

    def generate(self, name, messages, sampling, seed):
        text = super().generate(name, messages, sampling, seed)
        real = messages[0]["content"].startswith("Real")
        return LONG if real and name.startswith("gate.") else text


def _land(cfg, tenant, task, prompts):
    from pipelines.contract.events import Message, ModelTurn
    from tests.reward.reward_lake import at, land

    land(cfg.lake, [ModelTurn(tenant=tenant, app="bot", task=task, trace_id=f"tr{i}", turn_id=f"u{i}", turn_index=0,
                              event_time=at(i), model="m", input_messages=[Message(role="user", content=q)],
                              output_text="x") for i, q in enumerate(prompts)])


def test_the_gate_run_says_its_decision_reasons_numbers_and_links_in_its_description(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server, side_by_side=2)
    _land(cfg, tenant, task, ["Real question A?", "Real question B?"])
    rv, av = candidate(cfg, tenant, task)
    r = run_gate(cfg, tenant, task, rv, backend=Talkative(policy_for({av: (3, True)}, tenant, task)), gate=gate,
                 training_prompts=[])
    assert r.decision.outcome == "promote", r.decision.reasons
    run = client(cfg).get_run(r.run_id)
    note = run.data.tags[review.RUN_NOTE]
    # the decision first, with the model version it decided on (a link the run page renders)
    assert note.startswith(f"**promote**: `{tenant}.{task}` [model version {rv}](#/models/{tenant}.{task}/versions/{rv}) "
                           "against the base model."), note[:300]
    assert "Reasons:" in note and all(f"- {x}" in note for x in r.decision.reasons)
    # the per-suite table: candidate vs champion, diff, lower bound, p, passed
    answers, style = r.decision.verdicts
    assert review.suite_table_header() in note
    assert (f"| answers | primary | 30 | 1.000 | 0.333 | +0.667 | {answers.stats.low:+.3f} | "
            f"{answers.stats.p_gain:.3g} | yes |") in note
    assert f"| style | guardrail | 20 | 1.000 | 1.000 | +0.000 | +0.000 | {style.stats.p_loss:.3g} | yes |" in note
    assert "| refusal | 0.000 | 0.000 |" in note  # behaviour signatures, a row each
    # the side-by-side table, linked from the description
    assert (f"[gate/side_by_side.json](#/experiments/{run.info.experiment_id}/runs/{r.run_id}/artifacts/"
            "gate/side_by_side.json?workflowType=machine_learning), 2 recent real prompts") in note
    # the model version's page says the same, led by the link to this run
    desc = client(cfg).get_model_version(model_name(tenant, task), rv).description
    assert f"runs/{r.run_id}?workflowType=machine_learning)" in desc.split("\n")[2]
    assert all(f"- {x}" in desc for x in r.decision.reasons) and review.suite_table_header() in desc


def test_a_rejection_says_what_blocked_it_in_the_description_and_one_tag(tmp_path, mlflow_server):
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv, av = candidate(cfg, tenant, task)
    r = run_gate(cfg, tenant, task, rv, backend=FakeBackend(policy_for({av: (3, False)}, tenant, task)), gate=gate,
                 training_prompts=[])  # right answers without the full stop: the guardrail regresses
    assert r.decision.outcome == "reject"
    note = client(cfg).get_run(r.run_id).data.tags[review.RUN_NOTE]
    assert note.startswith("**reject**") and "| style | guardrail | 20 | 0.000 | 1.000 | -1.000 |" in note
    assert "| **no** |" in note and "beyond tolerance" in note
    tags = client(cfg).get_model_version(model_name(tenant, task), rv).tags
    assert tags[review.DECISION] == "reject" and "guardrail suite 'style'" in tags[review.REASONS]
    assert review.BLOCKED_BY not in tags  # no behaviour signature blocked it


def test_a_version_carries_only_searchable_tags(tmp_path, mlflow_server):
    """The learner's and the gate's version tags are the few listed (registry.VERSION_TAGS,
    review.GATE_TAGS): the numbers went to the runs' metrics and the descriptions."""
    import mlflow

    from pipelines import tracking
    from pipelines.adapters.store import AdapterStore

    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv1, av1 = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av1: (2, True)}, tenant, task))
    assert run_gate(cfg, tenant, task, rv1, backend=backend, gate=gate, training_prompts=[]).decision.outcome == "promote"
    # a registration as the learner makes it, with a tag the version does not keep
    src = tmp_path / "src"
    src.mkdir()
    (src / "adapter_config.json").write_text("{}")
    (src / "adapter_model.safetensors").write_bytes(b"weights of v2")
    av2 = AdapterStore(cfg.adapter_root).publish(tenant, task, src, {
        "parent_version": av1, "base_model_hash": "ab", "data_window": {}, "reward_spec_version": [], "config": {},
        "metrics": {}}).version
    with tracking.run(cfg, "learner", tags={"tracerl.stage": "learner"}, params={}) as run:
        mlflow.log_artifacts(str(src), "adapter")
    learner_tags = {"tenant": tenant, "task": task, "parent_version": av1, "base_model": "tiny", "base_model_hash": "ab",
                    "reward_spec_version": "s1", "tracerl.branch.base": str(av1), "tracerl.branch.depth": "1",
                    "tracerl.branch.parent": str(av1), "tracerl.branch.reset_reason": "none", "data_turns": 465}
    rv2 = register_candidate(cfg, tenant, task, run.info.run_id, av2, learner_tags)
    backend.policies.update(policy_for({av2: (3, True)}, tenant, task))
    r = run_gate(cfg, tenant, task, rv2, backend=backend, gate=gate, training_prompts=[])
    assert r.decision.outcome == "promote", r.decision.reasons
    tags = client(cfg).get_model_version(model_name(tenant, task), rv2).tags
    ours = set(VERSION_TAGS) | set(review.GATE_TAGS)
    alias_moves = {reg.STATUS, reg.PREVIOUS, reg.REASON, reg.HISTORY, "tracerl.promoted_by"}
    assert set(tags) <= ours | alias_moves, set(tags) - ours - alias_moves
    assert "data_turns" not in tags and len(set(tags) & ours) <= 15
    assert len(ours) <= 18 and len(tags) <= 20  # the vocabulary: 12 from registration, the gate's 6
    assert tags["base_model_hash"] == "ab" and tags[review.RUN_ID] == r.run_id


def test_the_side_by_side_is_an_mlflow_table_with_full_texts(tmp_path, mlflow_server):
    """`mlflow.log_table`: {"columns", "data"} JSON, listed in the run's `mlflow.loggedArtifacts` tag
    as a table (what makes the UI's artifact view a table, whose cells open their full text), every
    reply whole up to side_by_side.MAX_CHARS."""
    cfg, gate, tenant, task = setup(tmp_path, mlflow_server, side_by_side=3)
    _land(cfg, tenant, task, ["Real question A?", "Real question B?"])
    rv, av = candidate(cfg, tenant, task)
    r = run_gate(cfg, tenant, task, rv, backend=Talkative(policy_for({av: (3, True)}, tenant, task)), gate=gate,
                 training_prompts=[])
    run = client(cfg).get_run(r.run_id)
    logged = json.loads(run.data.tags["mlflow.loggedArtifacts"])
    assert {"path": "gate/side_by_side.json", "type": "table"} in logged
    path = client(cfg).download_artifacts(r.run_id, "gate/side_by_side.json", str(tmp_path / "dl"))
    table = json.loads(open(path).read())
    assert table["columns"] == ["prompt", "candidate", "champion", "candidate_score", "champion_score",
                                "earlier_messages"]
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [x["prompt"] for x in rows] == ["Real question B?", "Real question A?"]
    assert all(x["candidate"] == LONG and x["champion"] == "It is secret-0." for x in rows)
    assert len(LONG) > 500


def test_the_eval_plot_reads_the_gate_runs_and_tells_candidate_from_champion(tmp_path, mlflow_server):
    from pipelines.gate.plots import history_figure, score_history

    cfg, gate, tenant, task = setup(tmp_path, mlflow_server)
    rv1, av1 = candidate(cfg, tenant, task)
    backend = FakeBackend(policy_for({av1: (2, True)}, tenant, task))
    run_gate(cfg, tenant, task, rv1, backend=backend, gate=gate, training_prompts=[])
    rv2, av2 = candidate(cfg, tenant, task, parent=av1)
    backend.policies.update(policy_for({av2: (3, True)}, tenant, task))
    run_gate(cfg, tenant, task, rv2, backend=backend, gate=gate, training_prompts=[])
    h = score_history(cfg, tenant, task)
    assert set(h) == {"answers", "style"}
    cand, champ = h["answers"]["candidate"], h["answers"]["champion"]
    assert [v for v, _ in cand] == [1, 2] and [round(y, 3) for _, y in cand] == [0.667, 1.0]
    assert [round(y, 3) for _, y in champ] == [0.333, 0.667]  # the base, then v1: v1's score again
    fig = history_figure(h, "scores")
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]  # no tick at 1.25
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        c, k = lines["answers: candidate"], lines["answers: champion"]
        assert c.get_marker() != k.get_marker() and c.get_linestyle() != k.get_linestyle()
        assert c.get_color() == k.get_color() and list(k.get_xdata()) != list(c.get_xdata())  # drawn apart
        assert k.get_markerfacecolor() != c.get_markerfacecolor()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_the_reward_plots_have_one_name_per_scale_and_integer_version_ticks(tmp_path, monkeypatch):
    """The learner's plot is the reward spec's mean turn reward, the loop report's the simulated
    users' liked share: never both "live reward"; versions and iterations tick on integers."""
    import matplotlib.pyplot as plt

    from pipelines.loop import report
    from pipelines.train.plots import VersionReward, reward_figure

    fig = reward_figure([VersionReward(0, -1.12, 0.1, 40), VersionReward(1, -0.4, 0.1, 50),
                         VersionReward(2, 0.05, 0.1, 60)], "acme/concise: mean turn reward by serving version")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    train_names = (ax.get_title() + ax.get_ylabel()).lower()
    plt.close(fig)
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)  # keep the report's figures to read them
    reports = [report.IterationReport(i, i - 1, share, 100, 0, outcome="promote", eval_candidate=e, eval_champion=e)
               for i, share, e in ((1, 0.10, 0.4), (2, 0.45, 0.6), (3, 0.72, 0.8))]
    report.plot(reports, 0.72, tmp_path)
    live, evals = figs[0].axes[0], figs[1].axes[0]
    loop_names = (live.get_title() + live.get_ylabel()).lower()
    assert "mean turn reward" in train_names and "liked share (simulated users)" in loop_names
    assert "live reward" not in train_names + loop_names
    for a in (live, evals):
        assert all(float(t.get_text()).is_integer() for t in a.get_xticklabels())
    champ, cand = evals.get_lines()
    assert champ.get_marker() != cand.get_marker() and champ.get_linestyle() != cand.get_linestyle()
    assert list(cand.get_xdata()) != list(champ.get_xdata())  # the promoted candidate no longer hides
    for f in figs:
        f.clf()


def test_the_learners_counts_add_up_and_say_why_turns_dropped():
    from pipelines.train.run import trained_sentence

    s = trained_sentence(465, 461, {"empty_outputs": 0.0, "stale_dropped": 0.0, "dropped_zero_advantage": 4.0})
    assert s == "465 in all, 461 trained, 4 dropped: 4 with no advantage (a reward at its baseline)"
    s = trained_sentence(20, 14, {"empty_outputs": 1.0, "stale_dropped": 2.0, "dropped_uniform": 3.0})
    assert s.startswith("20 in all, 14 trained, 6 dropped: 1 with an empty reply; 2 too stale")
    assert "3 with no advantage (a reward at its baseline, or a group whose replies all got the same reward)" in s
    assert trained_sentence(10, 8, {"neutral_dropped": 2.0}).endswith("2 with a neutral reward (KTO needs a thumbs "
                                                                      "up or down)")
    assert trained_sentence(5, 5, {}) == "5 in all, 5 trained"


def test_dagster_metadata_numbers_are_rounded_to_four_significant_digits():
    from assets.gate import eval_metadata, primary_eval, rounded, sig

    assert sig(0.6666666666666666) == 0.6667 and sig(-1.1234567) == -1.123 and sig(1234.5678) == 1235.0
    assert rounded({"a": [0.123456, True, 3], "b": {"c": float("nan"), "d": "x"}}) == \
        {"a": [0.1235, True, 3], "b": {"c": None, "d": "x"}}
    md = eval_metadata({"suites": {"answers": {"role": "primary", "candidate": 2 / 3, "champion": 1 / 3, "delta": 1 / 3},
                                   "style": {"role": "guardrail", "candidate": 1.0, "champion": 1.0, "delta": 0.0}}})
    assert set(md) == {"primary_suite", *(f"eval.{s}.{k}" for s in ("answers", "style")
                                         for k in ("candidate", "champion", "delta"))}
    assert primary_eval({k: v.value for k, v in md.items()}) == (0.6667, 0.3333)


def test_links_open_the_model_training_view(tmp_path, mlflow_server, capsys):
    """Experiment and run links carry `workflowType=machine_learning` (MLflow 3.17 opens a bare
    experiment link on its GenAI overview); the bare link MLflow's client prints as a run ends on a
    server is replaced by tracerl's."""
    from pipelines import tracking
    from pipelines.tracking import run_path, runs_url

    cfg, _, _, _ = setup(tmp_path, mlflow_server)
    exp = tracking.experiment_id(cfg)
    assert runs_url(cfg, mlflow_server + "/") == f"{mlflow_server}/#/experiments/{exp}?workflowType=machine_learning"
    assert run_path(exp, "abc", "gate/x.json") == \
        f"#/experiments/{exp}/runs/abc/artifacts/gate/x.json?workflowType=machine_learning"
    capsys.readouterr()
    with tracking.run(cfg, "printed", tags={}, params={}) as r:
        pass
    out = capsys.readouterr().out
    assert "View experiment at" not in out and f"/#/experiments/{exp}\n" not in out
    assert f"{mlflow_server}/{run_path(exp, r.info.run_id)}" in out
    assert f"{mlflow_server}/#/experiments/{exp}?workflowType=machine_learning" in out


def test_run_url_metadata_links_the_run_in_the_model_training_view(tmp_path, mlflow_server):
    from assets.links import run_url
    from pipelines import tracking

    cfg, _, _, _ = setup(tmp_path, mlflow_server)
    with tracking.run(cfg, "linked", tags={}, params={}) as r:
        pass
    url = run_url(cfg, r.info.run_id).value
    assert url == f"{mlflow_server}/#/experiments/{r.info.experiment_id}/runs/{r.info.run_id}?workflowType=machine_learning"


def test_the_learners_metadata_adds_up_is_rounded_and_says_each_number_once(tmp_path, monkeypatch):
    import dagster as dg

    from assets import train as train_asset
    from assets.resources import TracerlResource, service_resources
    from assets.targets import materialize_target
    from pipelines.train.run import LearnerResult

    result = LearnerResult("acme", "support", "trained", new_turns=209, adapter_version=3, parent_version=2,
                           registry_version="3", mlflow_run_id="r" * 32, replayed_turns=256, branch_depth=1,
                           metrics={"trained_turns": 461, "dropped_turns": 4, "loss": 0.123456789, "kl": 0.0123456,
                                    "reward_mean": -1.1234567, "coverage": 0.87654321, "labelled_turns": 200,
                                    "model_labelled_turns": 9, "turns.thumbs": 200, "turns.model": 9,
                                    "reward_model.auroc": 0.71234567, "reward_model.reason": "usable"})
    monkeypatch.setattr(train_asset, "run_learner", lambda cfg, tenant, task: result)
    monkeypatch.setattr(train_asset, "new_turns_reward", lambda *a: 0.0512345678)
    with dg.instance_for_test() as instance:
        run = materialize_target([train_asset.candidate_adapter], "acme", "support", instance=instance,
                                 resources=service_resources(TracerlResource(home=str(tmp_path))))
    (mat,) = run.asset_materializations_for_node("candidate_adapter")
    md = {k: v.value for k, v in mat.metadata.items()}
    assert md["turns"] + md["replayed_turns"] == md["trained_turns"] + md["dropped_turns"] == 465
    assert (md["loss"], md["kl"], md["reward_mean"], md["coverage"], md["new_turns_reward"]) == \
        (0.1235, 0.01235, -1.123, 0.8765, 0.05123)
    assert md["reward_model"] == {"auroc": 0.7123, "reason": "usable"}
    assert md["turns_by_source"] == {"thumbs": 200, "model": 9}
    assert "model_labelled_turns" not in md and "mlflow_run_id" not in md  # said by turns_by_source, the link
    assert md["mlflow_run"].endswith(f"/runs/{'r' * 32}?workflowType=machine_learning")
