"""`tracerl loop`: one iteration of the closed-loop job for one target, in-process, on the real
broker and a real Dagster instance (DAGSTER_HOME in a temp folder). The runs here have nothing to
train, so they need no vLLM: the learner says why, and the run still completes (exit 0); a run
that fails exits 1; a second iteration for a target with one going is refused (exit 2)."""

from __future__ import annotations

import uuid

import dagster as dg
import pytest

from assets.driver import LoopBusy, run_iteration, target_lock
from assets.resources import TracerlResource
from tracerl import cli
from pipelines.config import load_config
from tests.conftest import write_stack_toml


@pytest.fixture
def loop_home(tmp_path, broker, monkeypatch):
    """A tracerl.toml on the session broker (fresh topic and group) and a fresh DAGSTER_HOME."""
    from pipelines.services.kafka import ensure_topic

    toml = write_stack_toml(tmp_path, broker.bootstrap, "loop")
    monkeypatch.setenv("TRACERL_CONFIG", str(toml))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    cfg = load_config(toml)
    ensure_topic(cfg)
    return cfg, toml


def test_loop_command_runs_the_job_and_prints_the_outcome(loop_home, capsys):
    cfg, toml = loop_home
    assert cli.main(["loop", "--tenant", "acme", "--task", "concise"]) == 0
    out = capsys.readouterr().out
    assert "acme/concise: Dagster run " in out and "succeeded (outcome: no_candidate)" in out
    assert "candidate: none: 0 new settled turns < learner.min_new_turns=" in out
    assert "serving:   nothing routed (the base model) (registry champion: none)" in out

    instance = dg.DagsterInstance.get()  # the persistent instance under DAGSTER_HOME: the UI's runs
    (run,) = instance.get_runs()
    assert run.run_config["resources"]["tracerl"]["config"] == {"config_path": str(toml), "home": str(cfg.home)}
    assert run.job_name == "closed_loop_job" and run.status == dg.DagsterRunStatus.SUCCESS
    assert run.tags["dagster/partition"] == "acme/concise" and run.tags["tracerl/driver"] == "cli"
    assert run.tags["tracerl/outcome"] == "no_candidate"
    assert instance.get_dynamic_partitions("targets") == ["acme/concise"]
    steps = {e.step_key for e in instance.all_logs(run.run_id) if e.dagster_event and e.dagster_event.is_step_success}
    assert steps == {"raw_events", "lake_events", "lake_events_lake_lag", "turn_rewards",
                     "candidate_adapter"}  # nothing to gate


def test_a_failed_run_exits_1_and_names_the_step(loop_home, capsys, monkeypatch):
    cfg, toml = loop_home
    toml.write_text(toml.read_text().replace(f'topic = "{cfg.kafka.topic}"', 'topic = "no-such-topic"'))
    assert cli.main(["loop", "--tenant", "acme", "--task", "concise"]) == 1
    out = capsys.readouterr().out
    assert "FAILED (outcome: failed)" in out and "failed:    raw_events:" in out and "no-such-topic" in out


def test_a_second_iteration_for_the_same_target_is_refused(loop_home, capsys):
    cfg, toml = loop_home
    instance = dg.DagsterInstance.get()
    resource = TracerlResource(config_path=str(toml))

    # another process (another `tracerl loop`, the demo) holds the target
    with target_lock(cfg, "acme/concise"):
        assert cli.main(["loop", "--tenant", "acme", "--task", "concise"]) == 2
        assert "refused: acme/concise: another process is running an iteration" in capsys.readouterr().err
        with pytest.raises(LoopBusy):
            run_iteration(resource, "acme", "concise", instance=instance)

    # a run the daemon started (sensor, schedule, UI) is queued or going for it
    busy = dg.DagsterRun(job_name="closed_loop_job", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED,
                         tags={"dagster/partition": "acme/concise"})
    instance.add_run(busy)
    with pytest.raises(LoopBusy, match=f"Dagster run {busy.run_id} .* is still going"):
        run_iteration(resource, "acme", "concise", instance=instance)
    assert [r.run_id for r in instance.get_runs()] == [busy.run_id]  # nothing was started


def test_the_run_loads_every_setting_of_the_drivers_resource(loop_home):
    """The demo's reward spec is a resource field: it must reach the run's assets, not only this process."""
    from pipelines.loop.demo import SIM_REWARD_SPEC

    cfg, toml = loop_home
    resource = TracerlResource(config_path=str(toml), reward_spec=str(SIM_REWARD_SPEC))
    run = run_iteration(resource, "acme", "concise", instance=dg.DagsterInstance.get())
    assert run.success
    config = dg.DagsterInstance.get().get_run_by_id(run.run_id).run_config["resources"]["tracerl"]["config"]
    assert TracerlResource(**config).load().reward.spec == str(SIM_REWARD_SPEC)


def test_step_watcher_holds_its_context_exactly_while_the_step_runs():
    """How the demo's swap-probe users run during `deployment` and only then, the job unaware."""
    import time

    from assets.driver import StepWatcher, read_run

    class Recorder:
        entered = exited = None

        def __enter__(self):
            self.entered = time.time()

        def __exit__(self, *exc):
            self.exited = time.time()

    @dg.asset
    def before():
        time.sleep(0.5)

    @dg.asset(deps=[before])
    def watched():
        time.sleep(3.0)

    @dg.asset(deps=[watched])
    def after():  # long enough that a watcher still holding its context here is seen, even under load
        time.sleep(5.0)

    job = dg.define_asset_job("watched_job", selection=[before, watched, after])
    defs = dg.Definitions(assets=[before, watched, after], jobs=[job])
    rec = Recorder()
    with dg.instance_for_test() as instance:
        run_id = str(uuid.uuid4())
        with StepWatcher(instance, run_id, {"watched": rec}, poll_s=0.05):
            assert defs.resolve_job_def("watched_job").execute_in_process(instance=instance, run_id=run_id).success
        run = read_run(instance, run_id)
    assert set(run.stage_s) == {"before", "watched", "after"} and run.stage_s["watched"] >= 3.0
    started = run.step_end["watched"] - run.stage_s["watched"]
    assert run.step_end["before"] <= rec.entered and rec.entered - started < 2.0  # not before the step, and in it
    # and not into the next step's end: a 0.5 s bound failed once under CI load (exit 2.5 s after the
    # step, the poller starved), so the bound is the next step, not the clock
    assert run.step_end["watched"] <= rec.exited < run.step_end["after"] - 2.0


def test_the_resource_s_target_entries_reach_every_run_and_are_checked(loop_home):
    """`targets_json` (the canary demo's per-target canary) is merged over tracerl.toml's targets
    in every run that loads the resource; a wrong key fails the load, naming it."""
    import json

    from pipelines.config.parse import ConfigError

    _, toml = loop_home
    entry = {"acme/concise": {"canary": {"enabled": True, "share": 0.5}}}
    cfg = TracerlResource(config_path=str(toml), targets_json=json.dumps(entry)).load()
    assert cfg.for_target("acme", "concise").canary.enabled and cfg.for_target("acme", "concise").canary.share == 0.5
    assert not cfg.for_target("acme", "other").canary.enabled and not cfg.canary.enabled
    bad = {"acme/concise": {"canary": {"shares": 0.5}}}
    with pytest.raises(ConfigError, match="shares"):
        TracerlResource(config_path=str(toml), targets_json=json.dumps(bad)).load()
