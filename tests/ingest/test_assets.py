"""The Dagster side of ingest: definitions load, the asset lands data with run metadata
and a quarantine-rate check, and the TOML config reaches it through the resource."""

import dagster as dg
import pytest

from assets.definitions import defs
from assets.ingest import lake_events, raw_events
from assets.resources import TracerlResource, service_resources
from pipelines.ingest.producer import TraceProducer
from pipelines.ingest.sample import bad_messages, generate
from tests.ingest.poison import poison_decoder, poisoned


def test_definitions_load_with_schedule_and_check():
    repo = defs.get_repository_def()
    assert repo.has_schedule_def("ingest_every_5_minutes")
    assert dg.AssetKey("lake_events") in {k for a in repo.assets_defs_by_key.values() for k in a.keys}
    spec_names = {c.name for c in lake_events.check_specs}
    assert "quarantine_rate" in spec_names
    assert repo.has_schedule_def("lake_lag_every_5_minutes")
    assert dg.AssetCheckKey(dg.AssetKey("lake_events"), "lake_lag") in defs.resolve_asset_graph().asset_check_keys
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey("lake_events")).parent_keys == {dg.AssetKey("raw_events")}
    topic = graph.get(dg.AssetKey("raw_events"))
    assert topic.is_observable and not topic.is_materializable and topic.kinds == {"kafka"}
    # every ingest run observes the topic first, then lands the batch
    assert defs.resolve_job_def("ingest_job").asset_layer.executable_asset_keys == {
        dg.AssetKey("raw_events"), dg.AssetKey("lake_events")}


def _observe(resource):
    job = dg.define_asset_job("observe_topic", selection=[raw_events])
    result = dg.Definitions(assets=[raw_events], jobs=[job], resources=service_resources(resource)) \
        .resolve_job_def("observe_topic").execute_in_process(raise_on_error=False)
    return result


def _toml(cfg, tmp_path) -> str:
    path = tmp_path / "tracerl.toml"
    path.write_text(
        f'home = "{cfg.home}"\nlake_root = "{cfg.lake}"\n'
        f'[kafka]\nbootstrap_servers = "{cfg.kafka.bootstrap_servers}"\ntopic = "{cfg.kafka.topic}"\n'
        f'group_id = "{cfg.kafka.group_id}"\n[ingest]\nidle_seconds = 1.0\nmax_event_bytes = 65536\n'
    )
    return str(path)


def _materialize(path):
    result = dg.materialize([lake_events], resources=service_resources(TracerlResource(config_path=path)))
    assert result.success
    meta = result.asset_materializations_for_node("lake_events")[0].metadata
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert set(checks) == {"quarantine_rate", "no_internal_errors"}
    return meta, checks["quarantine_rate"], checks["no_internal_errors"]


def test_asset_run_metadata_and_passing_check(cfg, tmp_path):
    events = generate(20, seed=1)
    with TraceProducer(cfg) as p:
        for e in events:
            p.send(e)
        p.send_raw(b"k", b"not json")
    meta, check, isolation = _materialize(_toml(cfg, tmp_path))
    assert meta["rows_written"].value == len(events)
    assert meta["rows_quarantined"].value == 1
    assert sum(last - first + 1 for first, last in meta["offsets_consumed"].value.values()) == len(events) + 1
    assert check.check_name == "quarantine_rate" and check.passed
    assert isolation.passed and meta["internal_errors"].value == 0


def test_quarantine_rate_check_fails_on_a_broken_client(cfg, tmp_path):
    with TraceProducer(cfg) as p:
        for e in generate(3, seed=2):
            p.send(e)
        for _, raw in bad_messages(65536) * 3:
            p.send_raw(b"k", raw)
    meta, check, isolation = _materialize(_toml(cfg, tmp_path))
    assert meta["rows_quarantined"].value == 27
    assert isolation.passed  # the client's fault, not the decoder's
    assert not check.passed and check.metadata["quarantine_rate"].value > 0.05


def test_a_message_that_made_decode_raise_turns_the_isolation_check_red(cfg, tmp_path, monkeypatch):
    """The run still succeeds and lands every other tenant's events; the red check says a decoder bug
    was hit, how often, and what it raised."""
    poison_decoder(monkeypatch)
    events = generate(6, seed=5)
    with TraceProducer(cfg) as p:
        for e in events[1:]:
            p.send(e)
        p.send_raw(b"k", poisoned(events[0]))
    meta, check, isolation = _materialize(_toml(cfg, tmp_path))
    assert meta["rows_written"].value == len(events) - 1 and meta["internal_errors"].value == 1
    assert "RecursionError" in meta["decode_failure"].value
    assert not isolation.passed and isolation.severity == dg.AssetCheckSeverity.ERROR
    assert isolation.metadata["internal_errors"].value == 1


def test_topic_observation_reports_offsets_and_what_ingest_committed(cfg, tmp_path):
    resource = TracerlResource(config_path=_toml(cfg, tmp_path))
    with TraceProducer(cfg) as p:
        for e in generate(20, seed=3):
            p.send(e)

    def observe():
        result = _observe(resource)
        assert result.success
        (obs,) = result.asset_observations_for_node("raw_events")
        return obs.tags["dagster/data_version"], obs.metadata

    version, meta = observe()
    assert meta["topic"].value == cfg.kafka.topic and meta["bootstrap_servers"].value == cfg.kafka.bootstrap_servers
    assert int(version) == meta["end_offset_total"].value == sum(meta["end_offsets"].value.values()) > 0
    assert set(meta["committed_offsets"].value.values()) == {None}

    _materialize(resource.config_path)  # ingest commits the landed offsets to its group, for lag tools
    again, meta = observe()
    assert again == version  # nothing new on the topic
    assert None not in meta["committed_offsets"].value.values()

    with TraceProducer(cfg) as p:
        for e in generate(5, seed=4):
            p.send(e)
    newer, meta = observe()
    assert int(newer) > int(version)


def test_unreachable_broker_is_a_clear_failure(tmp_path, monkeypatch):
    from pipelines.config import TracerlConfig

    monkeypatch.setattr("assets.resources.BOOTSTRAP_TIMEOUT_MS", 1000)
    path = tmp_path / "tracerl.toml"
    path.write_text(f'home = "{tmp_path}"\n[kafka]\nbootstrap_servers = "127.0.0.1:1"\n')
    result = _observe(TracerlResource(config_path=str(path)))
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "127.0.0.1:1" in failure.step_failure_data.user_failure_data.description

    from assets.resources import topic_offsets

    with pytest.raises(dg.Failure, match="embedded Kafka broker is not running"):
        topic_offsets(TracerlConfig(home=tmp_path))  # embedded, never started


def test_the_daily_vacuum_job_deletes_orphan_files_through_the_lake_resource(tmp_path):
    import os
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.config import TracerlConfig
    from pipelines.lake import delta

    cfg = TracerlConfig(home=tmp_path / "home")
    delta.append(cfg.table_store, delta.EVENTS, pa.table({"turn_id": ["a"], "tenant": ["acme"], "date": ["2026-12-01"]}))
    orphan = cfg.lake / delta.EVENTS / "tenant=acme" / "date=2026-12-01" / "part-00000-orphan.parquet"
    pq.write_table(pa.table({"turn_id": ["b"]}), orphan)
    os.utime(orphan, (time.time() - 2 * 86400,) * 2)
    toml = tmp_path / "tracerl.toml"
    toml.write_text(f'home = "{cfg.home}"\n')
    result = defs.resolve_job_def("lake_vacuum_job").execute_in_process(
        run_config={"resources": {"tracerl": {"config": {"config_path": str(toml)}}}})
    assert result.success and not orphan.exists()
    assert delta.open_table(cfg.table_store, delta.EVENTS).to_pyarrow_table().num_rows == 1
