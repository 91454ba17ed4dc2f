"""`make demo`: the embedded broker, sample traffic, the ingest asset run through
Dagster's persistent instance (so the run shows in the UI), then what landed."""

import os
from pathlib import Path

import dagster as dg

from assets.ingest import lake_events
from assets.resources import TracerlResource
from pipelines.config import TracerlConfig


def run_demo(cfg: TracerlConfig, traces: int = 500) -> int:
    from pipelines.ingest.producer import TraceProducer
    from pipelines.ingest.sample import bad_messages, generate
    from pipelines.lake.query import connect
    from pipelines.services.kafka import start_broker

    os.environ.setdefault("DAGSTER_HOME", str(Path("dagster_home").resolve()))
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    if cfg.kafka.embedded:
        state = start_broker(cfg)
        print(f"[1/4] kafka: embedded Tansu broker on {state.bootstrap}")
    else:
        print(f"[1/4] kafka: {cfg.kafka.bootstrap_servers}")

    events = generate(traces, seed=int.from_bytes(os.urandom(2), "big"))
    bad = bad_messages(cfg.ingest.max_event_bytes)
    with TraceProducer(cfg) as producer:
        for e in events:
            producer.send(e)
        for e in events[:25]:  # a retrying client: the same events again
            producer.send(e)
        for reason, raw in bad:
            producer.send_raw(b"bad-sample", raw, reason)
    print(f"[2/4] produced {len(events)} events from {traces} traces of 3 apps, 25 retried duplicates, "
          f"{len(bad)} bad messages")

    result = dg.materialize(
        [lake_events], instance=dg.DagsterInstance.get(),
        resources={"tracerl": TracerlResource(home=str(cfg.home))},
    )
    meta = result.asset_materializations_for_node("lake_events")[0].metadata
    print(f"[3/4] dagster run {result.run_id[:8]} (DAGSTER_HOME={os.environ['DAGSTER_HOME']}): "
          f"{meta['rows_written'].value} rows written, {meta['rows_quarantined'].value} quarantined, "
          f"{meta['duplicates_skipped'].value} duplicates skipped")

    con = connect(cfg.lake)
    print(f"[4/4] the lake at {cfg.lake.resolve()}, through DuckDB:")
    con.sql("SELECT tenant, app, type, count(*) AS events FROM events GROUP BY ALL ORDER BY ALL").show()
    con.sql("SELECT reason, kafka_partition, kafka_offset, left(error, 70) AS error "
            "FROM quarantine ORDER BY reason").show(max_width=160)
    print("Query it yourself:  .venv/bin/tracerl sql \"SELECT kind, count(*) FROM feedback GROUP BY ALL\"")
    print("See the run:        make dagster   (then open http://127.0.0.1:3000)")
    return 0
