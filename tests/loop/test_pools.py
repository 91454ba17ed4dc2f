"""Ingest keeps its schedule while two learners run (issue #40): the learner's and the gate's
limits are concurrency pools, not the run queue, and the loop's shared steps do their work once.

A real `dagster dev` (webserver + daemon) on a fresh DAGSTER_HOME with the repository's
dagster.yaml as it ships, on the session's Kafka broker and a real lake. Two `learner_job` runs
train (the tiny Llama, with more steps than the test waits for) and fill the `learner` pool. Then
what the */5 schedules start, an `ingest_job` and a `reward_job` run, goes through the same run
queue, with two `closed_loop_job` runs for two other targets: all of them start and finish their
ingest and reward work while both learners still train; the four ingest steps run one at a time
and only the first lands the events waiting in Kafka (the loops' ingest is done once, not once per
target); the reward steps run one at a time; the loops' learners wait for a slot. With the old
instance (`max_concurrent_runs: 2`, the learner the only pool) the ingest run stays queued behind
the learners and the test fails on its deadline.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from pipelines.config import load_config
from pipelines.models.tiny import make_tiny_llama
from pipelines.reward.engine import run_rewards
from tests.conftest import write_stack_toml
from tests.loop.test_parallel_learners import settle
from tests.reward.reward_lake import now

REPO = Path(__file__).resolve().parents[2]
LEARNING = [("acme", "concise"), ("globex", "support")]  # learner_job: settled turns, a long training
LOOPING = [("initech", "tps"), ("umbrella", "qa")]       # closed_loop_job: nothing to train
TRACES = 12                                              # sample traces waiting in Kafka
START = dg.DagsterEventType.STEP_START
END = (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.STEP_SKIPPED)


@pytest.fixture
def pool_home(tmp_path, broker, monkeypatch):
    """A tracerl.toml on the session broker (fresh topic) and the tiny Llama with a learner that
    trains for longer than the test lasts; a fresh DAGSTER_HOME with the repo's dagster.yaml."""
    from pipelines.services.kafka import ensure_topic

    tiny = make_tiny_llama(tmp_path / "tiny", seed=0, warmup_steps=0)
    toml = write_stack_toml(tmp_path, broker.bootstrap, "pools", f'''
[train]
base_model = "{tiny}"
seed = 0
[train.optimizer]
steps_per_iteration = 100000
micro_batch_size = 8
[learner]
min_new_turns = 4
max_turns = 8
[gate]
suites_dir = "{tmp_path / 'evals'}"
''')
    monkeypatch.setenv("TRACERL_CONFIG", str(toml))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a core per learner, as the pool's limit assumes
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    cfg = load_config(toml)
    ensure_topic(cfg)
    return cfg


def steps(instance: dg.DagsterInstance, run_id: str) -> dict[str, list[float]]:
    """Step key -> [start, end] (end missing while the step runs) from the run's event log."""
    out: dict[str, list[float]] = {}
    for e in instance.all_logs(run_id, of_type={START, *END}):
        if e.dagster_event.event_type == START:
            out[e.step_key] = [e.timestamp]
        elif e.step_key in out:
            out[e.step_key].append(e.timestamp)
    return out


def materialized(instance: dg.DagsterInstance, run_id: str, asset: str) -> dict:
    (m,) = [e.asset_materialization for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
            if e.asset_materialization.asset_key == dg.AssetKey(asset)]
    return {k: v.value for k, v in m.metadata.items()}


def disjoint(windows: list[list[float]]) -> bool:
    spans = sorted(windows)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def wait(what: str, done, timeout: float, poll: float = 1.0, state=lambda: ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = done()
        if out:
            return out
        time.sleep(poll)
    pytest.fail(f"{what}: not after {timeout:.0f} s {state()}")


@pytest.mark.slow
def test_ingest_keeps_its_schedule_while_two_learners_run(pool_home):
    from dagster_graphql import DagsterGraphQLClient

    from assets.targets import ensure_target
    from pipelines.ingest.producer import TraceProducer
    from pipelines.ingest.sample import generate
    from pipelines.services.dagster import start_dagster, stop_dagster

    cfg = pool_home
    t0 = time.time()
    state = start_dagster(cfg)  # `python -m assets.pools` first: the learner's limit on the instance
    instance = dg.DagsterInstance.get()
    client = DagsterGraphQLClient("127.0.0.1", port_number=state.port)
    try:
        assert {p: i.limit for p, i in instance.event_log_storage.get_concurrency_infos(
            ["learner", "gate", "ingest", "rewards"]).items()} == {"learner": 2, "gate": 1, "ingest": 1, "rewards": 1}
        # The enough_new_turns sensor ticks as the daemon starts, then every 5 minutes: settle after
        # its first tick, or it starts loops for the learning targets before this test does.
        log = cfg.log_dir / "dagster.log"
        wait("the sensor's first tick", lambda: "Sensor enough_new_turns skipped" in log.read_text(), 120)
        for tenant, task in LEARNING:
            settle(cfg, tenant, task)
        run_rewards(cfg.lake, now=now(0) + timedelta(days=2))

        learners = [client.submit_job_execution("learner_job", tags={"dagster/partition": ensure_target(instance, *t)})
                    for t in LEARNING]
        wait("both learners training", lambda: all("candidate_adapter" in steps(instance, r) for r in learners), 240)
        assert len(instance.event_log_storage.get_concurrency_info("learner").claimed_slots) == 2  # the pool is full

        events = generate(TRACES, seed=3)
        with TraceProducer(cfg) as producer:  # waiting in Kafka for the first ingest step
            for e in events:
                producer.send(e)
        produced = time.time()

        # What the */5 schedules start, through the same queue, and two loops for other targets.
        submitted = time.time()
        ingest = client.submit_job_execution("ingest_job")
        reward = client.submit_job_execution("reward_job")
        loops = [client.submit_job_execution("closed_loop_job", tags={"dagster/partition": ensure_target(instance, *t)})
                 for t in LOOPING]

        def waiting_for_the_learner() -> set[str]:
            info = instance.event_log_storage.get_concurrency_info("learner")
            return {p.run_id for p in info.pending_steps if p.assigned_timestamp is None}

        def work_done() -> bool:
            runs = [instance.get_run_by_id(r) for r in (ingest, reward)]
            if not all(r.is_finished for r in runs):
                return False
            landed = all(len(steps(instance, r).get(s, [])) == 2 for r in loops for s in ("lake_events", "turn_rewards"))
            return landed and waiting_for_the_learner() == set(loops)  # then the loops' learners wait for a slot

        def state() -> str:
            return str({instance.get_run_by_id(r).job_name: instance.get_run_by_id(r).status.value for r in (ingest, reward)})

        wait("ingest, rewards and the loops' ingest and rewards done", work_done, 360, poll=2.0, state=state)
        done = time.time()
        # ...while both learners still train: nothing waited behind them
        for r in learners:
            assert instance.get_run_by_id(r).status == dg.DagsterRunStatus.STARTED
            assert len(steps(instance, r)["candidate_adapter"]) == 1, "a learner stopped before the test's runs were done"
        claimed = instance.event_log_storage.get_concurrency_info("learner").claimed_slots
        assert {s.run_id for s in claimed} == set(learners)

        for r in (ingest, reward):
            run = instance.get_run_by_id(r)
            assert run.status == dg.DagsterRunStatus.SUCCESS, (run.job_name, run.status)
        queued = {}
        for r in (ingest, reward):
            record = instance.get_run_record_by_id(r)
            queued[record.dagster_run.job_name] = round(record.start_time - record.create_timestamp.timestamp(), 1)
        print(f"queued {queued} s; ingest and reward steps done {done - submitted:.0f} s after submitting "
              f"(test so far {done - t0:.0f} s)")
        assert max(queued.values()) < 120, queued  # on schedule: long before the next */5 tick

        # The loops' ingest and reward steps took turns with ingest_job's and reward_job's; the
        # first ingest landed what waited in Kafka, the others found nothing new. The daemon's own
        # */5 ingest schedule counts too when a tick fell inside the test (it then lands first).
        ticked = [r.run_id for r in instance.get_runs(dg.RunsFilter(job_name="ingest_job"))
                  if r.run_id != ingest and r.tags.get("dagster/schedule_name")
                  and steps(instance, r.run_id).get("lake_events", [0])[0] >= produced]
        wait("the scheduled ingest runs' landing", lambda: all(len(steps(instance, r)["lake_events"]) == 2 for r in ticked), 120)
        lands = {r: steps(instance, r)["lake_events"] for r in (ingest, *loops, *ticked)}
        assert disjoint(list(lands.values())), lands
        landed = {r: materialized(instance, r, "lake_events")["rows_written"] for r in lands}
        first = min(lands, key=lambda r: lands[r][0])
        assert landed[first] == len(events) and all(landed[r] == 0 for r in lands if r != first), landed
        settles = {r: steps(instance, r)["turn_rewards"] for r in (reward, *loops)}
        assert disjoint(list(settles.values())), settles
        after = sorted((w[0], r) for r, w in settles.items() if w[0] >= lands[first][1])
        read = {r: materialized(instance, r, "turn_rewards")["new_event_files"] for _, r in after}
        assert all(read[r] == 0 for _, r in after[1:]), read  # past the first reward step after the landing
    finally:
        stop_dagster(cfg)  # and with it the learners and the loops still going (one process group)


def test_the_in_process_driver_waits_for_the_pools_like_the_daemon_s_runs(pool_home, capsys):
    """`tracerl loop` (the demo's driver) on the instance as it ships: in-process runs skip the run
    queue, not the pools. With the `ingest` slot held (another run landing), the loop's lake_events
    waits for it, then the run completes and gives every slot back."""
    import threading

    from tracerl import cli

    instance = dg.DagsterInstance.get()
    storage = instance.event_log_storage
    storage.initialize_concurrency_limit_to_default("ingest")  # 1, dagster.yaml's default_limit
    assert storage.claim_concurrency_slot("ingest", "another-run", "lake_events").is_claimed
    exit_code = []
    loop = threading.Thread(target=lambda: exit_code.append(cli.main(["loop", "--tenant", "initech", "--task", "tps"])))
    loop.start()
    try:
        def blocked():
            runs = instance.get_runs()
            return runs and any("blocked by limit for pool ingest" in (e.message or "") and e.step_key == "lake_events"
                                for e in instance.all_logs(runs[0].run_id, of_type=dg.DagsterEventType.ENGINE_EVENT))

        wait("the loop's ingest blocked by the pool", blocked, 120, poll=0.5)
        time.sleep(2)
        (run,) = instance.get_runs()
        assert not run.is_finished and "lake_events" not in steps(instance, run.run_id)
    finally:
        storage.free_concurrency_slot_for_step("another-run", "lake_events")
        loop.join(300)
    assert exit_code == [0] and "succeeded (outcome: no_candidate)" in capsys.readouterr().out
    infos = storage.get_concurrency_infos(["learner", "ingest", "rewards", "gate"])
    assert {p: i.limit for p, i in infos.items()} == {"learner": 2, "ingest": 1, "rewards": 1, "gate": 1}
    assert not any(i.claimed_slots or i.pending_steps for i in infos.values())  # every slot given back


def test_the_learner_s_limit_is_set_on_the_instance_and_an_operator_s_is_kept():
    from assets.pools import ensure_pool_limits

    with dg.instance_for_test(overrides={"concurrency": {"pools": {"default_limit": 1}}}) as instance:
        storage = instance.event_log_storage
        storage.initialize_concurrency_limit_to_default("learner")  # a claim before it was set: from the default
        assert ensure_pool_limits(instance) == {"learner": 2, "gate": 1, "ingest": 1, "rewards": 1}
        assert not storage.get_concurrency_info("learner").using_default_limit  # Dagster will not reset it
        storage.set_concurrency_slots("learner", 4)  # `dagster instance concurrency set learner 4`
        assert ensure_pool_limits(instance)["learner"] == 4
