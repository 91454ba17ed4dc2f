"""Learners for different targets train at once, each in its own Dagster run, as many as the
`learner` concurrency pool allows.

A real `dagster dev` (webserver + daemon, the repo's dagster.yaml as it ships) on a fresh
DAGSTER_HOME launches `learner_job` runs through its queued run coordinator and default run
launcher (a process per run), on a real lake with settled rewards for three targets, the tiny Llama
and the home's MLflow store. The run queue admits more runs than there are targets, so only the
pool holds a learner back: two train side by side, the third waits for a slot, all three register
a candidate.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.pools import LIMITS
from pipelines.config import load_config
from pipelines.contract.events import Message, ModelTurn
from pipelines.models.tiny import make_tiny_llama
from pipelines.reward.engine import run_rewards
from tests.reward.reward_lake import ENV, at, fb, land, now

REPO = Path(__file__).resolve().parents[2]
TARGETS = [("acme", "concise"), ("acme", "polite"), ("globex", "support")]
STEP = "candidate_adapter"


def settle(cfg, tenant: str, task: str) -> None:
    """Four thumbed turns for tenant/task (2 prompts x 2 samples, one liked, one disliked), rewarded."""
    events = []
    for k in range(2):
        for s, thumb in enumerate((1, -1)):
            tid, t = f"{tenant}-{task}-p{k}-s{s}", k * 10 + s
            events.append(ModelTurn(**{**ENV, "tenant": tenant, "task": task}, turn_id=tid, turn_index=0,
                                    event_time=at(t), model="m",
                                    input_messages=[Message(role="user", content=f"{task} question {k}")],
                                    output_text="Sure, done." if thumb > 0 else "No."))
            events.append(fb(tid, "thumbs", t=t + 1, value=thumb, tenant=tenant, task=task))
    land(cfg.lake, events)


@pytest.fixture
def learner_home(tmp_path, monkeypatch):
    """A tracerl.toml on the tiny Llama, and a fresh DAGSTER_HOME with the repo's dagster.yaml."""
    tiny = make_tiny_llama(tmp_path / "tiny", seed=0, warmup_steps=0)
    toml = tmp_path / "tracerl.toml"
    toml.write_text(f'''home = "{tmp_path / 'home'}"
[train]
base_model = "{tiny}"
seed = 0
[train.optimizer]
lr = 1e-3
steps_per_iteration = 2
micro_batch_size = 8
[learner]
min_new_turns = 4
max_turns = 8
[gate]
suites_dir = "{tmp_path / 'evals'}"
''')
    monkeypatch.setenv("TRACERL_CONFIG", str(toml))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    home = tmp_path / "dagster_home"
    home.mkdir()
    instance_yaml = yaml.safe_load((REPO / "dagster_home" / "dagster.yaml").read_text())
    assert instance_yaml["concurrency"]["runs"]["max_concurrent_runs"] > len(TARGETS)  # the queue is not the limit
    assert LIMITS["learner"] == 2  # what this test shows holding (set on the instance by start_dagster)
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return load_config(toml)


def step_window(instance: dg.DagsterInstance, run_id: str) -> tuple[float, float]:
    """When the run's learner step started and ended (its STEP_START and STEP_SUCCESS events)."""
    times = {e.dagster_event.event_type: e.timestamp for e in instance.all_logs(run_id)
             if e.dagster_event and e.step_key == STEP
             and e.dagster_event.event_type in (dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS)}
    return times[dg.DagsterEventType.STEP_START], times[dg.DagsterEventType.STEP_SUCCESS]


def most_at_once(windows: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in windows] + [(b, -1) for _, b in windows], key=lambda e: (e[0], e[1]))
    n = best = 0
    for _, d in edges:
        n += d
        best = max(best, n)
    return best


def test_two_targets_train_at_once_and_the_pool_holds_the_third(learner_home):
    from dagster_graphql import DagsterGraphQLClient

    from assets.targets import ensure_target
    from pipelines.adapters import registry
    from pipelines.adapters.store import AdapterStore
    from pipelines.services.dagster import start_dagster, stop_dagster

    cfg = learner_home
    state = start_dagster(cfg)
    try:
        # The enough_new_turns sensor ticks as the daemon starts, then every 5 minutes: settle the
        # rewards after its first tick, or it starts loop runs for the targets before this test does.
        log = cfg.log_dir / "dagster.log"
        deadline = time.time() + 120
        while "Sensor enough_new_turns skipped" not in log.read_text() and time.time() < deadline:
            time.sleep(1)
        for tenant, task in TARGETS:
            settle(cfg, tenant, task)
        run_rewards(cfg.lake, now=now(0) + timedelta(days=2))

        instance = dg.DagsterInstance.get()
        client = DagsterGraphQLClient("127.0.0.1", port_number=state.port)
        run_ids = [client.submit_job_execution("learner_job", tags={"dagster/partition": ensure_target(instance, *t)})
                   for t in TARGETS]
        deadline = time.time() + 420
        while time.time() < deadline:
            runs = [instance.get_run_by_id(r) for r in run_ids]
            if all(r.is_finished for r in runs):
                break
            time.sleep(2)
        statuses = {r.tags["dagster/partition"]: r.status for r in runs}
        assert statuses == {f"{a}/{b}": dg.DagsterRunStatus.SUCCESS for a, b in TARGETS}, statuses

        windows = [step_window(instance, r) for r in run_ids]
        assert most_at_once(windows) == 2, windows  # two trained side by side, never three
    finally:
        stop_dagster(cfg)
    store = AdapterStore(cfg.adapter_root)
    for tenant, task in TARGETS:  # each target got its own candidate, trained on its own four turns
        mv = registry.version_for_adapter(cfg, tenant, task, 1)
        assert mv is not None and mv.tags["tenant"] == tenant and mv.tags["task"] == task
        window = store.get(tenant, task, 1).meta["data_window"]["turn_ids"]
        assert sorted(window) == [f"{tenant}-{task}-p{k}-s{s}" for k in range(2) for s in range(2)]
