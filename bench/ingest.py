"""Ingest throughput against a bare kafka-python consume loop, side by side in one run.

Produces >= 200k realistic trace events to the embedded broker, then measures
(a) a bare consumer that only decodes JSON, and (b) the full exactly-once
ingest (validate, dedupe, Parquet zstd in a Delta commit, fsync, offset commit).
Both read the same topic with their own consumer group; both clocks start at
the first record, so the fixed group-join wait is excluded from both. They run
alternately, ROUNDS times each (every ingest round into an empty lake): the bare
loop alone varied 29-35k events/s from run to run on the 2 shared cores, so one
pair of runs says little; the last line is the median of the rounds' ratios.

    .venv/bin/python bench/ingest.py
Last line: ingest_vs_raw_ratio=<median>   (target >= 0.9, #17)
"""

from __future__ import annotations

import json
import shutil
import statistics
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
ROUNDS = 3


def raw_consume(cfg: TracerlConfig, n: int) -> float:
    """Events/s of a consume loop that does nothing but json.loads."""
    from kafka import KafkaConsumer, TopicPartition

    # assigned, as ingest is (pipelines/ingest/offsets.py): no group join on either side
    c = KafkaConsumer(**client_options(cfg), group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest",
                      max_poll_records=cfg.ingest.max_poll_records, max_partition_fetch_bytes=8 << 20,
                      fetch_max_bytes=64 << 20)
    tps = [TopicPartition(cfg.kafka.topic, p) for p in sorted(c.partitions_for_topic(cfg.kafka.topic))]
    c.assign(tps)
    c.seek_to_beginning(*tps)
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

        ratios = []
        for i in range(ROUNDS):
            raw_eps = raw_consume(cfg, n)
            print(f"round {i + 1} (a) bare kafka-python consume + json.loads: {raw_eps:,.0f} events/s")
            cfg.lake_root = home / f"lake-{i}"
            r = run_ingest(cfg, max_events=n, group_id=f"bench-ingest-{i}")
            assert r.landed == n and r.quarantined == 0, r
            work = r.timings["poll"] + r.timings["land"] + r.timings["commit"]
            ingest_eps = n / work
            print(f"round {i + 1} (b) full ingest to Parquet, exactly once: {ingest_eps:,.0f} events/s "
                  f"(poll+validate {r.timings['poll']:.1f}s, land {r.timings['land']:.1f}s, "
                  f"commit {r.timings['commit']:.2f}s; versions {r.versions}): ratio {ingest_eps / raw_eps:.2f}")
            ratios.append(ingest_eps / raw_eps)
        print(f"ingest_vs_raw_ratio={statistics.median(ratios):.2f}")
    finally:
        stop_broker(cfg)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
