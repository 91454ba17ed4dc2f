"""What a registry reviewer sees in the MLflow UI after a gate run (headless Chromium, a real
`mlflow server` over the store the library wrote; fixtures in conftest.py).

A gate run (a scripted backend in place of vLLM: the pages, not the sampling, are under test)
promotes version 1 of `review.qa`, whose lake holds a few production prompts; the candidate answers
them at length. Then:
  * the experiment, from the link tracerl prints, opens on its runs table, where the gate run is
    listed by its name;
  * the gate run's page shows the decision, its reasons and the per-suite table in its
    description (not "No description");
  * the model version's page shows the gate's decision and reasons in its description, with a
    link to the gate run;
  * the gate run's `gate/side_by_side.json` renders as a table of the real prompts and both
    models' replies, and a cell opens the reply's full text.
Screenshots and page text land in the module's tmp folder.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TENANT, TASK = "review", "qa"
LONG = ("The candidate's long answer to a real customer, which a reviewer has to read to the end: "
        + "it weighs one option, then another, " * 12 + "and closes with the last words THE-END-7F3.")


def talkative(policies):
    """The gate's scripted backend, but the candidate answers real (non-eval) prompts with LONG."""
    from tests.gate.gate_fixtures import FakeBackend

    class Talkative(FakeBackend):
        def generate(self, name, messages, sampling, seed):
            text = super().generate(name, messages, sampling, seed)
            return LONG if messages[0]["content"].startswith("Real") and name.startswith("gate.") else text

    return Talkative(policies)


@pytest.fixture(scope="module")
def reviewed(e2e_dir, stack_cfg, mlflow_ui):
    """(MLflow URL, experiment id, gate run id, registered model name, registry version)."""
    from pipelines.config.gate import GateConfig
    from pipelines.contract.events import Message, ModelTurn
    from pipelines.adapters.registry import model_name
    from pipelines.gate.run import run_gate
    from pipelines.tracking import client
    from tests.gate.gate_fixtures import candidate, policy_for, write_suites
    from tests.reward.reward_lake import at, land

    url = mlflow_ui[0]
    write_suites(e2e_dir / "evals", TENANT, TASK)
    land(stack_cfg.lake, [ModelTurn(tenant=TENANT, app="bot", task=TASK, trace_id=f"tr{i}", turn_id=f"u{i}",
                                    turn_index=0, event_time=at(i), model="m", output_text="x",
                                    input_messages=[Message(role="user", content=f"Real customer question {i}?")])
                          for i in range(3)])
    rv, av = candidate(stack_cfg, TENANT, TASK)
    r = run_gate(stack_cfg, TENANT, TASK, rv, backend=talkative(policy_for({av: (3, True)}, TENANT, TASK)),
                 gate=GateConfig(suites_dir=str(e2e_dir / "evals"), temperature=0.0, samples_per_item=1),
                 training_prompts=[])
    assert r.decision.outcome == "promote" and r.side_by_side, r.decision.reasons
    exp = client(stack_cfg).get_run(r.run_id).info.experiment_id
    return url, exp, r.run_id, model_name(TENANT, TASK), rv


def test_the_experiment_opens_on_its_runs(stack_cfg, reviewed, browser):
    """The link tracerl prints (`tracerl up`, `runs_url`) opens on the runs table, not on MLflow 3's
    GenAI overview, which a bare experiment link shows ("Traces 0")."""
    from pipelines.tracking import runs_url

    url, exp, run_id, _, rv = reviewed
    run_name = f"gate {TENANT}/{TASK} v{rv} vs base"
    link = runs_url(stack_cfg, url)
    assert link == f"{url}/#/experiments/{exp}?workflowType=machine_learning"
    r = browser.visit(link, "document.body.innerText", lambda t: run_name in (t or ""), "mlflow-experiment",
                      timeout=90)
    assert r["ok"], f"the experiment page does not list the run {run_name!r}; screenshot {r['screenshot']}"
    assert "Traces\n0" not in r["text"]


def test_the_gate_run_page_shows_the_decision_and_its_reasons(stack_cfg, reviewed, browser):
    """The run's description (`mlflow.note.content`): the decision, every reason, the per-suite
    table and the link to the model version, where MLflow 3 showed "No description"."""
    from pipelines.tracking import client, run_path

    url, exp, run_id, name, rv = reviewed
    reasons = client(stack_cfg).get_model_version(name, rv).tags["tracerl.gate.reasons"].split(" | ")
    first = reasons[0][:60]
    probe = """({text: document.body.innerText,
                 links: Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href') || '')})"""

    def shown(v):
        return v and "Reasons" in v["text"] and first in v["text"]

    r = browser.visit(f"{url}/{run_path(exp, run_id)}", probe, shown, "mlflow-gate-run", timeout=90)
    assert r["ok"], f"the gate run's page lacks its decision and reasons; screenshot {r['screenshot']}"
    text = r["text"]
    assert "No description" not in text and "promote" in text and "primary suite 'answers'" in text
    assert "candidate" in text and "champion" in text and "lower bound" in text  # the per-suite table's header
    assert any(h.endswith(f"#/models/{name}/versions/{rv}") for h in r["value"]["links"]), r["value"]["links"]


def test_the_version_page_shows_the_decision_its_reasons_and_links_the_gate_run(reviewed, browser):
    url, exp, run_id, name, rv = reviewed
    probe = """({text: document.body.innerText,
                 links: Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href') || '')})"""

    def shown(v):
        return v and "promote" in v["text"] and "Reasons" in v["text"] and any(run_id in h for h in v["links"])

    r = browser.visit(f"{url}/#/models/{name}/versions/{rv}", probe, shown, "mlflow-version-review", timeout=90)
    assert r["ok"], (f"version {rv} page lacks the decision, its reasons or a link to run {run_id}; "
                     f"screenshot {r['screenshot']}")
    assert "primary suite 'answers'" in r["text"]


def test_the_side_by_side_table_renders_and_a_cell_opens_the_full_reply(reviewed, browser):
    """MLflow's table view of a `log_table` artifact cuts its cells to the column's width; a click on
    one opens its full text beside the table ("Preview"): the long reply is read there to its end."""
    import json

    from pipelines.gate.side_by_side import ARTIFACT
    from pipelines.tracking import run_path

    url, exp, run_id, _, _ = reviewed
    probe = """(() => {
      const text = document.body.innerText;
      const cell = Array.from(document.querySelectorAll('[role=cell], td'))
        .find(c => (c.innerText || '').startsWith(%s));
      if (!cell) return {text, preview: ''};
      cell.click();
      const after = document.body.innerText;
      const at = after.lastIndexOf('Preview');
      return {text: after, preview: at < 0 ? '' : after.slice(at)};
    })()""" % json.dumps(LONG[:40])
    r = browser.visit(f"{url}/{run_path(exp, run_id, ARTIFACT)}", probe,
                      lambda v: v and LONG in v["preview"], "mlflow-side-by-side", timeout=90)
    text = r["value"]["text"] if r["value"] else r["text"]
    assert "Real customer question 2?" in text and "candidate_score" in text, \
        f"{ARTIFACT} does not show the prompts and columns; screenshot {r['screenshot']}"
    assert r["ok"], f"a click on the long reply's cell does not show its full text; screenshot {r['screenshot']}"
