"""The Dagster side of ingest: definitions load, the asset lands data with run metadata
and a quarantine-rate check, and the TOML config reaches it through the resource."""

import dagster as dg

from assets.definitions import defs
from assets.ingest import lake_events
from assets.resources import TracerlResource
from pipelines.ingest.producer import TraceProducer
from pipelines.ingest.sample import bad_messages, generate


def test_definitions_load_with_schedule_and_check():
    repo = defs.get_repository_def()
    assert repo.has_schedule_def("ingest_every_5_minutes")
    assert dg.AssetKey("lake_events") in {k for a in repo.assets_defs_by_key.values() for k in a.keys}
    spec_names = {c.name for c in lake_events.check_specs}
    assert "quarantine_rate" in spec_names


def _toml(cfg, tmp_path) -> str:
    path = tmp_path / "tracerl.toml"
    path.write_text(
        f'home = "{cfg.home}"\nlake_root = "{cfg.lake}"\n'
        f'[kafka]\nbootstrap_servers = "{cfg.kafka.bootstrap_servers}"\ntopic = "{cfg.kafka.topic}"\n'
        f'group_id = "{cfg.kafka.group_id}"\n[ingest]\nidle_seconds = 1.0\nmax_event_bytes = 65536\n'
    )
    return str(path)


def _materialize(path):
    result = dg.materialize([lake_events], resources={"tracerl": TracerlResource(config_path=path)})
    assert result.success
    meta = result.asset_materializations_for_node("lake_events")[0].metadata
    (check,) = result.get_asset_check_evaluations()
    return meta, check


def test_asset_run_metadata_and_passing_check(cfg, tmp_path):
    events = generate(20, seed=1)
    with TraceProducer(cfg) as p:
        for e in events:
            p.send(e)
        p.send_raw(b"k", b"not json")
    meta, check = _materialize(_toml(cfg, tmp_path))
    assert meta["rows_written"].value == len(events)
    assert meta["rows_quarantined"].value == 1
    assert sum(last - first + 1 for first, last in meta["offsets_consumed"].value.values()) == len(events) + 1
    assert check.check_name == "quarantine_rate" and check.passed


def test_quarantine_rate_check_fails_on_a_broken_client(cfg, tmp_path):
    with TraceProducer(cfg) as p:
        for e in generate(3, seed=2):
            p.send(e)
        for _, raw in bad_messages(65536) * 3:
            p.send_raw(b"k", raw)
    meta, check = _materialize(_toml(cfg, tmp_path))
    assert meta["rows_quarantined"].value == 27
    assert not check.passed and check.metadata["quarantine_rate"].value > 0.05
