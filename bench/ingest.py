"""Ingest throughput against a bare kafka-python consume loop, side by side in one run.

Produces >= 200k realistic trace events to the embedded broker, then measures
(a) a bare consumer that only decodes JSON, and (b) the full exactly-once
ingest (validate, dedupe, Parquet zstd, fsync, manifest, offset commit).
Both read the same topic with their own consumer group; both clocks start at
the first record, so the fixed group-join wait is excluded from both.

    .venv/bin/python bench/ingest.py
Last line: ingest_vs_raw_ratio=<x>   (target >= 0.7)
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.config import TracerlConfig  # noqa: E402
from pipelines.ingest.producer import TraceProducer  # noqa: E402
from pipelines.ingest.run import run_ingest  # noqa: E402
from pipelines.ingest.sample import generate  # noqa: E402
from pipelines.services.kafka import client_options, start_broker, stop_broker  # noqa: E402

MIN_EVENTS = 200_000


def raw_consume(cfg: TracerlConfig, n: int) -> float:
    """Events/s of a consume loop that does nothing but json.loads."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(cfg.kafka.topic, **client_options(cfg), group_id="bench-raw", enable_auto_commit=False,
                      auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=2000,
                      max_poll_records=cfg.ingest.max_poll_records, max_partition_fetch_bytes=8 << 20,
                      fetch_max_bytes=64 << 20)
    seen, first = 0, None
    while seen < n:
        for msgs in c.poll(timeout_ms=200).values():
            first = first or time.monotonic()
            for m in msgs:
                json.loads(m.value)
            seen += len(msgs)
    elapsed = time.monotonic() - first
    c.close(autocommit=False)
    return n / elapsed


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="tracerl-bench-"))
    cfg = TracerlConfig(home=home)
    cfg.kafka.embedded_port = 19192
    state = start_broker(cfg)
    try:
        t = time.monotonic()
        events, seed = [], 0
        while len(events) < MIN_EVENTS:
            events += generate(5000, seed=seed)
            seed += 1
        with TraceProducer(cfg) as p:
            for e in events:
                p.send(e)
        n = len(events)
        mb = sum(len(json.dumps(e.to_dict())) for e in events[:5000]) / 5000 * n / 1e6
        print(f"produced {n} events (~{mb:.0f} MB JSON) to {state.bootstrap} in {time.monotonic() - t:.1f}s")

        raw_eps = raw_consume(cfg, n)
        print(f"(a) bare kafka-python consume + json.loads: {raw_eps:,.0f} events/s")

        r = run_ingest(cfg, max_events=n)
        assert r.landed == n and r.quarantined == 0, r
        work = r.timings["poll"] + r.timings["land"] + r.timings["commit"]
        ingest_eps = n / work
        print(f"(b) full ingest to Parquet, exactly once: {ingest_eps:,.0f} events/s "
              f"(poll+validate {r.timings['poll']:.1f}s, land {r.timings['land']:.1f}s, "
              f"commit {r.timings['commit']:.2f}s; {len(r.files)} files)")
        print(f"ingest_vs_raw_ratio={ingest_eps / raw_eps:.2f}")
    finally:
        stop_broker(cfg)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
