"""The code location as a whole: lineage from the Kafka topic to the gateway, the checks on the
way, freshness policies consistent with the schedules, targets as partitions, one loop job, and
what starts runs."""

from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from assets.definitions import defs

CHAIN = ["raw_events", "lake_events", "turn_rewards", "candidate_adapter", "promotion", "deployment"]
LINEAGE = [*CHAIN, "canary"]  # the canary follows deployment, in a job of its own


@pytest.fixture(scope="module")
def repo():
    return defs.get_repository_def()


@pytest.fixture(scope="module")
def graph():
    return defs.resolve_asset_graph()


def test_definitions_validate():
    dg.Definitions.validate_loadable(defs)


def test_lineage_runs_from_the_topic_to_the_gateway(graph):
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == set(LINEAGE)
    for parent, child in zip(LINEAGE, LINEAGE[1:]):
        assert graph.get(dg.AssetKey(child)).parent_keys == {dg.AssetKey(parent)}, child
    topic = graph.get(dg.AssetKey("raw_events"))
    assert topic.is_observable and not topic.is_materializable
    groups = {k: graph.get(dg.AssetKey(k)).group_name for k in LINEAGE}
    assert groups == {"raw_events": "ingest", "lake_events": "ingest", "turn_rewards": "reward",
                      "candidate_adapter": "train", "promotion": "gate", "deployment": "deploy", "canary": "deploy"}
    assert "kafka" in topic.kinds and "mlflow" in graph.get(dg.AssetKey("promotion")).kinds


def test_checks(graph):
    def key(asset, name):
        return dg.AssetCheckKey(dg.AssetKey(asset), name)

    assert set(graph.asset_check_keys) == {
        key("lake_events", "quarantine_rate"), key("lake_events", "no_internal_errors"), key("lake_events", "lake_lag"),
        key("turn_rewards", "unlabelled_share"), key("turn_rewards", "reward_bounds"),
        key("turn_rewards", "component_drift"),
        key("promotion", "no_contamination"),  # a gate rejection is an outcome, not a check
        key("canary", "guardrails_hold"), key("canary", "step_applied")}
    blocking = {k for k in graph.asset_check_keys if graph.get_check_spec(k).blocking}
    assert blocking == {key("turn_rewards", "reward_bounds"), key("promotion", "no_contamination")}


EVERY = {"ingest_every_5_minutes": ("*/5 * * * *", timedelta(minutes=5)),
         "rewards_every_5_minutes": ("2-59/5 * * * *", timedelta(minutes=5)),
         "closed_loop_hourly": ("17 * * * *", timedelta(hours=1))}


@pytest.mark.parametrize("asset, schedule", [("lake_events", "ingest_every_5_minutes"),
                                             ("turn_rewards", "rewards_every_5_minutes"),
                                             ("deployment", "closed_loop_hourly")])
def test_freshness_windows_fit_the_schedules(graph, repo, asset, schedule):
    policy = graph.get(dg.AssetKey(asset)).freshness_policy
    assert isinstance(policy, dg.FreshnessPolicy)
    fail, warn = policy.fail_window.to_timedelta(), policy.warn_window.to_timedelta()
    cron, every = EVERY[schedule]
    assert repo.get_schedule_def(schedule).cron_schedule == cron
    assert every < warn < fail  # a single late run does not warn; a stopped schedule fails
    assert fail <= 6 * every


def test_no_freshness_where_quiet_periods_are_normal(graph):
    for asset in ("candidate_adapter", "promotion"):  # materialize only when a candidate was trained
        assert graph.get(dg.AssetKey(asset)).freshness_policy is None


def test_schedules_sensors_and_jobs(repo):
    assert {s.name for s in repo.schedule_defs} == {
        "ingest_every_5_minutes", "rewards_every_5_minutes", "closed_loop_hourly", "lake_vacuum_daily",
        "lake_lag_every_5_minutes", "retention_daily", "forget_hourly"}
    assert repo.get_schedule_def("lake_lag_every_5_minutes").job_name == "lake_lag_job"
    assert {s.name: s.job_name for s in repo.sensor_defs} == {
        "enough_new_turns": "closed_loop_job", "approved_challengers": "approval_job",
        "canary_settling": "canary_job"}
    assert repo.get_schedule_def("closed_loop_hourly").job_name == "closed_loop_job"
    assert repo.get_schedule_def("lake_vacuum_daily").job_name == "lake_vacuum_job"
    assert repo.get_schedule_def("retention_daily").job_name == "retention_job"
    assert repo.get_schedule_def("forget_hourly").job_name == "forget_job"
    assert all(s.default_status == dg.DefaultScheduleStatus.RUNNING for s in repo.schedule_defs)

    layer = defs.resolve_job_def("closed_loop_job").asset_layer
    assert layer.executable_asset_keys == {dg.AssetKey(k) for k in CHAIN}  # the whole loop, one run
    assert set(layer.asset_graph.asset_check_keys) >= {dg.AssetCheckKey(dg.AssetKey("promotion"), "no_contamination"),
                                                       dg.AssetCheckKey(dg.AssetKey("turn_rewards"), "reward_bounds")}
    assert defs.resolve_job_def("ingest_job").asset_layer.executable_asset_keys == {
        dg.AssetKey("raw_events"), dg.AssetKey("lake_events")}
    assert repo.has_job("reward_job") and repo.has_job("approval_job")
    assert defs.resolve_job_def("canary_job").asset_layer.executable_asset_keys == {dg.AssetKey("canary")}
    assert defs.resolve_job_def("learner_job").asset_layer.executable_asset_keys == {dg.AssetKey("candidate_adapter")}
    assert defs.resolve_job_def("learner_job").partitions_def is not None  # one target per run, a backfill for many


def test_the_scarce_steps_are_in_pools_and_the_run_queue_is_not_the_limit(repo):
    """Learner and gate CPU is what is scarce, not runs (issue #40): the learner, the gate, and the
    shared ingest and reward steps are in pools, wherever they run; the instance's run queue admits
    more runs than the training lane may hold, so loops waiting for the learner never take the run
    slots ingest and rewards need."""
    import yaml

    from assets.pools import LANE_TAG, LEARNER_LANE, LIMITS

    pools = {n.name: set(n.pools) for j in repo.get_all_jobs() for n in j.graph.node_defs if n.pools}
    assert pools == {"candidate_adapter": {"learner"}, "promotion": {"gate"}, "lake_events": {"ingest"},
                     "turn_rewards": {"rewards"}}
    for job in ("closed_loop_job", "learner_job"):  # the runs that train are in the capped lane
        assert repo.get_job(job).run_tags[LANE_TAG] == LEARNER_LANE, job
    for job in ("ingest_job", "reward_job"):
        assert LANE_TAG not in repo.get_job(job).run_tags, job

    concurrency = yaml.safe_load((Path(__file__).parents[1] / "dagster_home" / "dagster.yaml").read_text())["concurrency"]
    assert concurrency["pools"]["granularity"] == "op"  # a loop run's waiting learner holds only itself
    assert concurrency["pools"]["default_limit"] == 1  # ingest, rewards, gate: one step at a time
    assert LIMITS == {"learner": 2}  # two targets train at once (set on the instance, assets/pools.py)
    limits = {(t["key"], str(t.get("value"))): t["limit"] for t in concurrency["runs"]["tag_concurrency_limits"]}
    lane = limits[(LANE_TAG, LEARNER_LANE)]
    assert lane >= LIMITS["learner"] + 1  # the learners and a gate busy at once
    assert concurrency["runs"]["max_concurrent_runs"] >= lane + 4  # room for ingest, rewards, lag, a canary


def test_targets_are_partitions_of_the_per_target_assets(graph):
    from assets.targets import targets

    for k in ("candidate_adapter", "promotion", "deployment", "canary"):  # each target: its own history and plots
        assert graph.get(dg.AssetKey(k)).partitions_def == targets, k
    for k in ("raw_events", "lake_events", "turn_rewards"):  # one topic, one lake: shared by every target
        assert graph.get(dg.AssetKey(k)).partitions_def is None, k
    assert defs.resolve_job_def("closed_loop_job").partitions_def == targets


def test_everything_says_what_it_is(repo, graph):
    """Descriptions on every job, schedule, sensor and asset; every asset in a group with its kinds."""
    described = {**{f"job {j.name}": j.description for j in repo.get_all_jobs() if not j.name.startswith("__")},
                 **{f"schedule {s.name}": s.description for s in repo.schedule_defs},
                 **{f"sensor {s.name}": s.description for s in repo.sensor_defs},
                 **{f"asset {k.to_user_string()}": graph.get(k).description for k in graph.get_all_asset_keys()}}
    assert not [name for name, text in described.items() if not text], described
    for k in graph.get_all_asset_keys():
        assert graph.get(k).group_name != "default" and graph.get(k).kinds, k


# Each asset, op and trigger asks for the services it touches, no more (the UI lists them per asset).
USES = {"raw_events": {"kafka"}, "lake_events": {"kafka", "lake"}, "turn_rewards": {"lake"},
        "candidate_adapter": {"lake", "mlflow"}, "promotion": {"lake", "mlflow"},
        "deployment": {"mlflow", "gateway"}, "canary": {"lake", "mlflow", "gateway"}}
SERVICES = {"kafka", "lake", "mlflow", "gateway"}


def test_each_asset_declares_the_services_it_uses(graph):
    for key, services in USES.items():
        assert defs.resolve_assets_def(dg.AssetKey(key)).required_resource_keys - {"io_manager"} == services, key


def test_the_triggers_and_the_approval_op_declare_their_services(repo):
    assert {s.name: s.required_resource_keys for s in repo.sensor_defs} == {
        "enough_new_turns": {"lake"}, "approved_challengers": {"mlflow"}, "canary_settling": {"lake"}}
    assert repo.get_schedule_def("closed_loop_hourly").required_resource_keys == {"lake"}
    op = defs.resolve_job_def("approval_job").graph.node_dict["promote_approved_versions"].definition
    assert op.required_resource_keys == {"mlflow", "gateway"}
    op = defs.resolve_job_def("retention_job").graph.node_dict["apply_retention_periods"].definition
    assert op.required_resource_keys == {"lake", "mlflow"}  # the lake's tables, the gate runs' review tables


def test_one_settings_resource_behind_every_service(repo):
    """Every service resource nests the code location's one `tracerl` resource, each says what it is."""
    top = repo.get_top_level_resources()
    assert set(top) == {"tracerl", *SERVICES}
    assert not [k for k, r in top.items() if not (r.description or "").strip()]
    assert all(defs.resources[k].tracerl is defs.resources["tracerl"] for k in SERVICES)


def test_the_runs_tracerl_config_reaches_every_service_and_an_edit_the_next_run(tmp_path):
    """Run config for `tracerl` alone (what the driver and the launchpad set) configures every
    service; the toml is read by each run, so an edit needs no restart of the code location."""
    from assets.resources import GatewayResource, KafkaResource, LakeResource, MlflowResource

    @dg.asset
    def probe(kafka: KafkaResource, lake: LakeResource, mlflow: MlflowResource, gateway: GatewayResource):
        return {name: (r.settings().kafka.topic, str(r.settings().home))
                for name, r in {"kafka": kafka, "lake": lake, "mlflow": mlflow, "gateway": gateway}.items()}

    toml = tmp_path / "tracerl.toml"
    toml.write_text(f'home = "{tmp_path}"\n[kafka]\ntopic = "first"\n')
    job = dg.Definitions(assets=[probe], resources=defs.resources).resolve_implicit_global_asset_job_def()
    config = {"resources": {"tracerl": {"config": {"config_path": str(toml)}}}}

    def seen():
        return job.execute_in_process(run_config=config).output_for_node("probe")

    assert seen() == {name: ("first", str(tmp_path)) for name in SERVICES}
    toml.write_text(f'home = "{tmp_path}"\n[kafka]\ntopic = "edited"\n')
    assert seen() == {name: ("edited", str(tmp_path)) for name in SERVICES}


def test_the_mlflow_resource_points_at_the_configured_store_without_exporting_it(tmp_path, monkeypatch):
    import os

    import mlflow

    from assets.resources import MlflowResource, TracerlResource

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("TRACERL_CONFIG", raising=False)
    from pipelines.tracking import use_store

    before = mlflow.get_tracking_uri()
    store = MlflowResource(tracerl=TracerlResource(home=str(tmp_path)))
    try:
        uri = store.use_store()
        assert uri == store.tracking_uri() and str(tmp_path) in uri and uri.startswith("sqlite:")
        assert mlflow.get_tracking_uri() == uri
        assert "MLFLOW_TRACKING_URI" not in os.environ  # the next run's tracerl.toml still decides
    finally:
        use_store(before)
