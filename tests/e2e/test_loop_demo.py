"""The acceptance test of "one loop, one truth", on the tiny model: the demo's driver runs two
iterations of the closed loop, and what the operator then sees is what happened.

Real everything: the session Kafka broker, vLLM (CPU, LoRA), the gateway, simulated users, the
MLflow store, a Dagster instance in a temp DAGSTER_HOME. Each iteration is one in-process run of
`closed_loop_job` (ingest -> rewards -> learner -> gate -> deployment), and then:

  * the demo's report (read from those runs) is consistent with the registry and the lake;
  * the Dagster catalog (a real `dagster-webserver` on that instance, read in headless Chromium)
    shows every asset of the loop materialized, and the runs page one run per iteration;
  * the MLflow registry UI shows as `champion` the version the gateway serves;
  * `tracerl loop` runs one more iteration and prints its outcome.
"""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import pytest

from tests.e2e.conftest import dagster_webserver, demo_env

pytestmark = pytest.mark.slow

ITERATIONS = 2
LOOP_ASSETS = ["raw_events", "lake_events", "turn_rewards", "candidate_adapter", "promotion", "deployment"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory, broker):
    """Two iterations of the demo's driver on the tiny model; the services stay up for the module.

    Yields (cfg, tracerl.toml, the demo's result, the Dagster instance)."""
    from assets.demo import run_demo
    from assets.resources import TracerlResource
    from pipelines.config import load_config
    from pipelines.loop.demo import LoopConfig
    from pipelines import stack
    from pipelines.services.kafka import ensure_topic
    from pipelines.sim.traffic import TrafficConfig

    tmp = tmp_path_factory.mktemp("loop-demo")
    with demo_env(tmp, broker.bootstrap, "demo") as toml:
        cfg = load_config(toml)
        ensure_topic(cfg)
        lc = LoopConfig(iterations=ITERATIONS, traffic=TrafficConfig(requests=48, users=8, max_tokens=12),
                        preference_max_tokens=8, swap_probe_users=2)
        try:
            out = run_demo(cfg, lc, resource=TracerlResource(config_path=str(toml)), stop_after=False)
            yield cfg, toml, out, dg.DagsterInstance.get()
        finally:
            for name in reversed(stack.SERVE):
                stack.stop(cfg, name)


def test_the_report_is_read_from_one_dagster_run_per_iteration(demo):
    from pipelines.adapters import registry
    from pipelines.lake.query import connect
    from pipelines.loop.report import STAGES
    from pipelines.tracking import client

    cfg, _, out, instance = demo
    r1, r2 = out["reports"]
    runs = instance.get_runs(dg.RunsFilter(job_name="closed_loop_job"))
    assert sorted(r.run_id for r in runs) == sorted([r1.run_id, r2.run_id])
    by_id = {run.run_id: run for run in runs}
    for r in (r1, r2):
        run = by_id[r.run_id]
        assert run.status == dg.DagsterRunStatus.SUCCESS and run.tags["dagster/partition"] == "acme/concise"
        assert run.tags["tracerl/outcome"] == r.outcome  # the gate's decision, on the run itself
        (mat,) = [e.asset_materialization for e in instance.all_logs(r.run_id)
                  if e.asset_materialization and e.asset_materialization.asset_key == dg.AssetKey("candidate_adapter")]
        assert mat.partition == "acme/concise" and mat.metadata["adapter_version"].value == r.candidate
        assert isinstance(mat.metadata["new_turns_reward"].value, float)  # the reward the UI plots per iteration

    # every stage ran and was timed (`deployment`, the swap stage, runs after every gate); all traffic served
    assert set(STAGES) <= set(r1.stage_s)
    assert r1.requests == r2.requests == 48 and r1.failed_requests == r2.failed_requests == 0
    assert r1.champion_before == 1 and r1.candidate == 2  # v1 is the bootstrap champion
    assert r1.outcome in ("promote", "reject") and r1.reasons
    assert r1.eval_candidate is not None and r1.eval_champion is not None

    # the next iteration is served by whatever the gate left as champion
    assert r2.champion_before == r1.champion_after
    for r in (r1, r2):
        if r.outcome == "promote":
            assert r.champion_after == r.candidate
            assert r.swap_requests > 0 and r.swap_failed == 0  # the probe users, during `deployment`
            assert r.freshness_s is not None and r.freshness_s > r.stage_s["traffic"]
        else:
            assert r.freshness_s is None and r.champion_after == r.champion_before
    assert registry.adapter_for_alias(cfg, "acme", "concise") == r2.champion_after

    # the turns the learner trained on are the ones the gateway served, with their adapter version
    served = dict(connect(cfg.lake).execute(
        "SELECT adapter_version, count(*) FROM turns WHERE tenant = 'acme' AND task = 'concise' GROUP BY 1").fetchall())
    assert served.get(1, 0) >= 48

    # the report and its plots are on an MLflow run
    c = client(cfg)
    exp = c.get_experiment_by_name(cfg.mlflow.experiment)
    [run] = c.search_runs([exp.experiment_id], "tags.`tracerl.stage` = 'loop'")
    assert {a.path for a in c.list_artifacts(run.info.run_id, "plots")} == {"plots/live_reward.png",
                                                                            "plots/eval_score.png"}
    assert [m.step for m in c.get_metric_history(run.info.run_id, "live_reward")] == [1, 2, 3]


@pytest.fixture(scope="module")
def loop_ui(demo):
    cfg, _, _, instance = demo
    with dagster_webserver(cfg, Path(instance.root_directory)) as url:
        yield url


# every asset of the catalog table: its link, and its row's text (the first ancestor of the link that
# also holds the code-location column, so the status column comes with it)
CATALOG_ROWS = """Array.from(document.querySelectorAll('a[href^="/assets/"]')).map(a => {
    let row = a;
    while (row && !(row.innerText || '').includes('assets.definitions')) row = row.parentElement;
    return [decodeURIComponent(a.getAttribute('href').slice(8)).replace(/\\/$/, ''),
            row ? row.innerText.replace(/\\s+/g, ' ').trim() : ''];
})"""


# the status column, last in a row: "Materialized • <when>" ("Observed • <when>" for the topic), or
# for a partitioned asset "All" (every partition materialized), 0 missing, 0 failed, 0 in progress
STATUS = re.compile(r"(?:(Materialized|Observed) • [^•]+|All 0 0 0 (\d+) partitions?)$")


def catalog_status(text: str) -> str | None:
    """"Materialized", "Observed" or "partitions" when the row says its asset is up to date, else None."""
    m = STATUS.search(text)
    return None if m is None else (m.group(1) or "partitions")


def test_the_report_shows_the_first_and_last_champions_replies_to_held_out_prompts(demo):
    """A reviewer reads what changed, not only rates: three held-out prompts, each with the first
    champion's reply and, after a promotion, the last one's, each marked liked or not."""
    from pipelines.adapters import registry
    from pipelines.sim.families import family_for_task

    cfg, _, out, _ = demo
    text, first = out["report"], out["reports"][0].champion_before
    last = registry.adapter_for_alias(cfg, "acme", "concise", registry.CHAMPION)
    block = text[text.index("sample replies on held-out prompts"):].splitlines()[1:]
    held = [m[-1]["content"] for m in family_for_task("concise").prompts("heldout")[:3]]
    assert [line[len("  prompt: "):] for line in block if line.startswith("  prompt: ")] == held
    for label in [f"v{first} (first)"] + ([f"v{last} (last)"] if last != first else []):
        assert sum(line.strip().startswith(label) for line in block) == 3, (label, block)
    assert all(line.split(")", 1)[1].lstrip()[:1] in "+-" for line in block if line.startswith("    ")), block


def test_dagster_catalog_shows_every_asset_of_the_loop_materialized(loop_ui, browser):
    def rows(v):
        return {key: text for key, text in v or [] if key in LOOP_ASSETS}

    def ready(v):  # every asset listed with its status loaded
        r = rows(v)
        return set(r) == set(LOOP_ASSETS) and all(catalog_status(t) for t in r.values())

    r = browser.visit(f"{loop_ui}/assets", CATALOG_ROWS, ready, "loop-dagster-catalog", timeout=120)
    seen = rows(r["value"])
    assert set(seen) == set(LOOP_ASSETS), f"catalog lists {sorted(seen)}; screenshot {r['screenshot']}"
    stale = {k: t for k, t in seen.items() if not catalog_status(t)}
    assert not stale, f"assets the catalog does not show materialized: {stale}; screenshot {r['screenshot']}"
    assert {k: catalog_status(t) for k, t in seen.items()} == {
        "raw_events": "Observed", "lake_events": "Materialized", "turn_rewards": "Materialized",
        "candidate_adapter": "partitions", "promotion": "partitions", "deployment": "partitions"}
    assert seen["candidate_adapter"].endswith(" 1 partition")  # acme/concise: the loop's only target


def test_dagster_runs_page_shows_one_run_per_iteration(demo, loop_ui, browser):
    _, _, out, _ = demo
    ids = [r.run_id[:8] for r in out["reports"]]
    probe = "document.body ? document.body.innerText : ''"
    r = browser.visit(f"{loop_ui}/runs", probe, lambda text: all(i in (text or "") for i in ids), "loop-dagster-runs",
                      timeout=90)
    missing = [i for i in ids if i not in r["text"]]
    assert not missing, f"runs page lacks run(s) {missing}; screenshot {r['screenshot']}"
    assert r["text"].count("closed_loop_job") >= ITERATIONS


def test_mlflow_registry_shows_as_champion_what_the_gateway_serves(demo, browser):
    from pipelines.adapters import registry
    from pipelines.deploy.routing import Router
    from pipelines.services.mlflow_server import start_mlflow, stop_mlflow

    cfg, _, _, _ = demo
    live = Router(cfg.home / "deploy" / "routes.json").live("acme", "concise")
    mv = registry.version_for_adapter(cfg, "acme", "concise", live.version)
    assert registry.adapter_for_alias(cfg, "acme", "concise") == live.version  # one truth: alias == route
    probe = """Array.from(document.querySelectorAll('[role=row]')).map(r => r.innerText.replace(/\\s+/g, ' ').trim())"""

    def champion_row(rows):
        return next((x for x in rows or [] if x.startswith(f"Version {mv.version} ") and "@ champion" in x), None)

    url = start_mlflow(cfg).url
    try:
        r = browser.visit(f"{url}/#/models/acme.concise", probe, champion_row, "loop-mlflow-model", timeout=90)
    finally:
        stop_mlflow(cfg)
    assert champion_row(r["value"]), (f"no row 'Version {mv.version} ... @ champion' (the gateway serves "
                                      f"v{live.version}); rows {r['value']}; screenshot {r['screenshot']}")


def test_loop_command_runs_one_more_iteration_and_prints_its_outcome(demo, capsys):
    from tracerl import cli
    from pipelines.adapters import registry
    from pipelines.deploy.service import read_gateway_state, tenant_key
    from pipelines.loop.demo import LoopConfig
    from pipelines.loop.traffic import wait_emitted
    from pipelines.sim.traffic import TrafficConfig, simulate

    cfg, _, out, instance = demo
    url = read_gateway_state(cfg).url
    lc = LoopConfig(preference_max_tokens=8)
    stats = simulate(url, tenant_key(cfg, "acme"), TrafficConfig(tenant="acme", task="concise", requests=48,
                                                                  users=8, max_tokens=12, seed=99), lc.preference())
    assert stats.failed == 0
    wait_emitted(cfg, url)
    capsys.readouterr()
    assert cli.main(["loop", "--tenant", "acme", "--task", "concise"]) == 0  # whatever the gate decides
    text = capsys.readouterr().out
    candidate = out["reports"][-1].candidate + 1
    assert "acme/concise: Dagster run " in text and " succeeded (outcome: " in text
    assert f"candidate: v{candidate} (registry version" in text
    gate = next(line for line in text.splitlines() if line.strip().startswith("gate:"))
    assert gate.split(":")[1].strip() in ("promote", "reject"), gate
    champion = registry.adapter_for_alias(cfg, "acme", "concise")
    assert f"serving:   v{champion} (registry champion: v{champion})" in text
    (run,) = instance.get_runs(dg.RunsFilter(job_name="closed_loop_job", tags={"tracerl/driver": "cli"}))
    assert run.status == dg.DagsterRunStatus.SUCCESS
