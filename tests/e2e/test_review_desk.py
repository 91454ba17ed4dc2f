"""What a registry reviewer sees in the MLflow UI after a gate run (headless Chromium, a real
`mlflow server` over the store the library wrote; fixtures in conftest.py).

A gate run (a scripted backend in place of vLLM: the pages, not the sampling, are under test)
promotes version 1 of `review.qa`, whose lake holds a few production prompts. Then:
  * the experiment, from the link tracerl prints, opens on its runs table, where the gate run is
    listed by its name;
  * the model version's page shows the gate's decision and reasons in its description, with a
    link to the gate run;
  * the gate run's `gate/side_by_side.json` renders as a table of the real prompts and both
    models' replies.
Screenshots and page text land in the module's tmp folder.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TENANT, TASK = "review", "qa"


@pytest.fixture(scope="module")
def reviewed(e2e_dir, stack_cfg, mlflow_ui):
    """(MLflow URL, experiment id, gate run id, registered model name, registry version)."""
    from pipelines.config.gate import GateConfig
    from pipelines.contract.events import Message, ModelTurn
    from pipelines.adapters.registry import model_name
    from pipelines.gate.run import run_gate
    from pipelines.tracking import client
    from tests.gate.gate_fixtures import FakeBackend, candidate, policy_for, write_suites
    from tests.reward.reward_lake import at, land

    url = mlflow_ui[0]
    write_suites(e2e_dir / "evals", TENANT, TASK)
    land(stack_cfg.lake, [ModelTurn(tenant=TENANT, app="bot", task=TASK, trace_id=f"tr{i}", turn_id=f"u{i}",
                                    turn_index=0, event_time=at(i), model="m", output_text="x",
                                    input_messages=[Message(role="user", content=f"Real customer question {i}?")])
                          for i in range(3)])
    rv, av = candidate(stack_cfg, TENANT, TASK)
    r = run_gate(stack_cfg, TENANT, TASK, rv, backend=FakeBackend(policy_for({av: (3, True)}, TENANT, TASK)),
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


def test_the_side_by_side_table_renders(reviewed, browser):
    url, exp, run_id, _, _ = reviewed
    r = browser.visit(f"{url}/#/experiments/{exp}/runs/{run_id}/artifacts/gate/side_by_side.json",
                      "document.body.innerText", lambda t: "Real customer question 2?" in (t or "")
                      and "candidate_score" in (t or ""), "mlflow-side-by-side", timeout=90)
    assert r["ok"], f"gate/side_by_side.json does not show the prompts and columns; screenshot {r['screenshot']}"
