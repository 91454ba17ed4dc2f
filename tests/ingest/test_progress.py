"""Ingest never stops silently (issue #40), on the embedded broker.

Ingest reads each partition from the lake's watermark without joining a consumer group, so a
group the broker can no longer coordinate cannot stall it; several ingests at once never wedge
each other and land every event once; a run that reads nothing over a backlog fails and names
why; the lake_lag check goes red while ingest is blocked and green once it caught up."""

from __future__ import annotations

import threading
import time

import dagster as dg
import duckdb
import pytest

from assets.definitions import defs
from assets.targets import ensure_target, parse_target
from pipelines.ingest.offsets import IngestError, lake_lag
from pipelines.ingest.producer import TraceProducer, encode
from pipelines.ingest.run import run_ingest
from pipelines.ingest.sample import generate
from pipelines.lake import delta


def _produce(cfg, n: int, seed: int, bad: int = 0, timestamp_ms: int | None = None) -> list[str]:
    events = generate(n, seed=seed)
    with TraceProducer(cfg) as p:
        for e in events:
            if timestamp_ms is None:
                p.send(e)
            else:
                key, value, _ = encode(e)
                p._producer.send(cfg.kafka.topic, key=key, value=value, timestamp_ms=timestamp_ms)
        for i in range(bad):
            p.send_raw(b"bad", f"not json {seed} {i}".encode())
    return [e.event_id for e in events]


def _lake_counts(cfg) -> tuple[dict[str, int], int, int]:
    """({event_id: rows}, quarantine rows, distinct quarantined offsets)."""
    con = duckdb.connect()
    table = delta.open_table(cfg.table_store, delta.EVENTS)
    events = table.to_pyarrow_table() if table is not None else None  # noqa: F841 - read by DuckDB
    rows = con.sql("select event_id, count(*) from events group by 1").fetchall() if table is not None else []
    q = delta.open_table(cfg.table_store, delta.QUARANTINE)
    if q is None:
        return dict(rows), 0, 0
    quarantine = q.to_pyarrow_table()
    distinct = con.execute("select count(distinct (kafka_partition, kafka_offset)) from quarantine").fetchone()[0]
    return dict(rows), quarantine.num_rows, distinct


def test_a_group_the_broker_left_wedged_does_not_stop_ingest(cfg):
    """The issue's sequence: two consumers join one group a second apart and both close; on the
    embedded broker no member of that group is assigned a partition again. Ingest, told to commit
    to that group, still lands every event and says the group's commit is only for lag tools."""
    from kafka import KafkaConsumer

    from pipelines.services.kafka import client_options

    ids = _produce(cfg, 30, seed=1)
    consumers = []
    for _ in range(2):
        c = KafkaConsumer(cfg.kafka.topic, **client_options(cfg), group_id=cfg.kafka.group_id,
                          enable_auto_commit=False, auto_offset_reset="earliest")
        c.poll(timeout_ms=500)
        consumers.append(c)
        time.sleep(1)
    for c in consumers:
        c.close(autocommit=False)
    started = time.monotonic()
    r = run_ingest(cfg)
    assert r.landed == len(ids) and r.consumed == len(ids)
    assert time.monotonic() - started < 20  # no join to wait for
    landed, _, _ = _lake_counts(cfg)
    assert set(landed) == set(ids) and set(landed.values()) == {1}
    again = run_ingest(cfg)  # nothing new: a quiet zero is right here
    assert again.consumed == 0 and again.landed == 0


def test_ingests_started_at_once_never_wedge_and_land_every_event_once(cfg, tmp_path, monkeypatch):
    """Two `run_ingest` calls and closed_loop_job runs for two targets (their ingest steps) at the
    same instant, three rounds with new traffic between them;
    then one more ingest. Every event exactly once, every bad message quarantined once."""
    toml = tmp_path / "race.toml"  # the Dagster runs read the same topic and lake as `cfg`
    toml.write_text(f'home = "{cfg.home}"\nlake_root = "{cfg.lake}"\n'
                    f'[kafka]\nbootstrap_servers = "{cfg.kafka.bootstrap_servers}"\ntopic = "{cfg.kafka.topic}"\n'
                    f'group_id = "{cfg.kafka.group_id}"\n[ingest]\nidle_seconds = 1.0\nmax_event_bytes = 65536\n')
    ids: list[str] = []
    bad = 0
    errors: list[BaseException] = []

    def ingest():
        try:
            run_ingest(cfg)
        except BaseException as e:  # noqa: BLE001 - collected, asserted below
            errors.append(e)

    def loop_run(target: str):
        """closed_loop_job's ingest steps for one target, as the sensor starts it."""
        try:
            tenant, task = parse_target(target)
            with dg.DagsterInstance.ephemeral() as instance:  # each its own: the runs share the lake only
                result = defs.resolve_job_def("closed_loop_job").execute_in_process(
                    instance=instance, partition_key=ensure_target(instance, tenant, task),
                    asset_selection=[dg.AssetKey("raw_events"), dg.AssetKey("lake_events")],
                    run_config={"resources": {"tracerl": {"config": {"config_path": str(toml)}}}})
                assert result.success
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    for round_ in range(3):
        ids += _produce(cfg, 40, seed=10 + round_, bad=3)
        bad += 3
        threads = [threading.Thread(target=ingest), threading.Thread(target=ingest),
                   threading.Thread(target=loop_run, args=("acme/concise",)),
                   threading.Thread(target=loop_run, args=("globex/support",))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "an ingest wedged"
        assert not errors, errors
    run_ingest(cfg)
    landed, quarantined, distinct = _lake_counts(cfg)
    assert set(landed) == set(ids) and set(landed.values()) == {1}
    assert quarantined == distinct == bad
    assert lake_lag(cfg).behind == 0


def test_a_run_that_reads_nothing_over_a_backlog_fails_and_names_why(cfg, monkeypatch):
    from kafka import KafkaConsumer

    ids = _produce(cfg, 10, seed=20)
    monkeypatch.setattr(KafkaConsumer, "poll", lambda self, *a, **k: {})  # a broker that returns no records
    with pytest.raises(IngestError, match=r"consumed nothing .* while Kafka holds \d+ events past the lake's watermarks"):
        run_ingest(cfg)
    monkeypatch.undo()
    assert run_ingest(cfg).landed == len(ids)


def test_a_watermark_past_the_log_is_an_error_not_a_skip(cfg):
    """A lake whose watermark is beyond the partition's log (the topic recreated under the same id,
    or truncated): the new events would be skipped as landed; ingest refuses and says why."""
    import pyarrow as pa

    from pipelines.ingest.offsets import data_consumer, topic_id_of

    consumer = data_consumer(cfg)
    consumer.topics()
    tid = topic_id_of(consumer, cfg.kafka.topic).get(cfg.kafka.topic, "")
    consumer.close()
    delta.append(cfg.table_store, delta.EVENTS, pa.table({"event_id": ["x"], "tenant": ["acme"], "date": ["2026-12-01"]}),
                 {(cfg.kafka.topic, tid, p): 10_000 for p in range(cfg.kafka.partitions)})
    _produce(cfg, 5, seed=21)
    with pytest.raises(IngestError, match="past the end of Kafka's log"):
        run_ingest(cfg)


def test_unreachable_broker_is_an_error_naming_it(cfg):
    cfg.kafka.bootstrap_servers = "127.0.0.1:1"
    with pytest.raises(IngestError, match="127.0.0.1:1"):
        run_ingest(cfg)


def _lag_check(toml) -> dg.AssetCheckEvaluation:
    result = defs.resolve_job_def("lake_lag_job").execute_in_process(
        run_config={"resources": {"tracerl": {"config": {"config_path": str(toml)}}}})
    assert result.success
    (check,) = result.get_asset_check_evaluations()
    return check


def test_the_lag_check_is_red_while_ingest_is_blocked_and_green_once_it_caught_up(cfg, tmp_path):
    toml = tmp_path / "lag.toml"
    toml.write_text(f'home = "{cfg.home}"\n'
                    f'[kafka]\nbootstrap_servers = "{cfg.kafka.bootstrap_servers}"\ntopic = "{cfg.kafka.topic}"\n'
                    f'[ingest]\nidle_seconds = 1.0\nlag_alarm_seconds = 600\nlag_alarm_events = 50\n')
    assert _lag_check(toml).passed  # empty topic, empty lake

    an_hour_ago = int(time.time() * 1000) - 3600 * 1000
    waiting = _produce(cfg, 2, seed=30, timestamp_ms=an_hour_ago)  # waiting an hour: ingest has not run
    check = _lag_check(toml)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert f"the oldest of {len(waiting)} events not in the lake was produced" in check.description
    assert check.metadata["events_behind"].value == len(waiting) and check.metadata["oldest_age_s"].value > 3500

    run_ingest(cfg)
    check = _lag_check(toml)
    assert check.passed and check.metadata["events_behind"].value == 0

    fresh = _produce(cfg, 20, seed=31)  # just produced, but more than lag_alarm_events
    check = _lag_check(toml)
    assert not check.passed and check.description == (
        f"{len(fresh)} events in Kafka are not in the lake (ingest.lag_alarm_events = 50)")
    run_ingest(cfg)
    assert _lag_check(toml).passed


def test_tracerl_status_reports_the_lake_lag(cfg, tmp_path, monkeypatch, capsys):
    from tracerl.cli import main

    toml = tmp_path / "status.toml"
    toml.write_text(f'home = "{cfg.home}"\n'
                    f'[kafka]\nbootstrap_servers = "{cfg.kafka.bootstrap_servers}"\ntopic = "{cfg.kafka.topic}"\n'
                    f'[ingest]\nlag_alarm_events = 3\n')
    monkeypatch.setenv("TRACERL_CONFIG", str(toml))
    ids = _produce(cfg, 5, seed=40)
    assert main(["status"]) == 1
    assert f"{len(ids)} events in Kafka not in the lake" in capsys.readouterr().out
    run_ingest(cfg)
    assert main(["status"]) == 0
    assert "0 events in Kafka not in the lake" in capsys.readouterr().out
