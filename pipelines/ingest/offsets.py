"""Where ingest resumes, and how far the lake trails Kafka: both read from the lake, not the group.

The lake's Delta application transactions record the last offset landed per Kafka partition
(`pipelines/lake/delta.py`), atomically with the rows. That is the only position exactly-once
needs, so ingest assigns itself the topic's partitions and starts each one just past its
watermark: no consumer-group join, so no broker's group coordination can stop it (issue #40: on
the embedded broker a group whose two members joined and left together was never assigned a
partition again, and ingest reported 0 consumed for good). The group still gets committed
offsets, for the lag tools people already use, but nothing reads them back.

Lag is measured the same way: per partition, the events past the lake's watermark and the age of
the first of them (the log's end read, not taken from the end offset: the embedded broker's
trails its log by up to a batch).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pipelines.config import TracerlConfig
from pipelines.lake import delta
from pipelines.services.kafka import BrokerError, client_options


class IngestError(RuntimeError):
    """Ingest could not make progress; the message names the cause."""


@dataclass
class PartitionLag:
    partition: int
    landed: int | None   # the lake's watermark: last offset landed (None: none yet)
    resume: int          # the next offset ingest reads
    end: int             # Kafka's end offset
    behind: int          # events in Kafka past the watermark
    oldest_ms: int | None = None  # the timestamp of the first of them


@dataclass
class LakeLag:
    """What Kafka holds that the lake does not, by partition."""

    topic: str
    topic_id: str
    partitions: list[PartitionLag] = field(default_factory=list)
    checked_ms: int = 0

    @property
    def behind(self) -> int:
        return sum(p.behind for p in self.partitions)

    @property
    def oldest_age_s(self) -> float:
        """Seconds since the oldest event not in the lake was produced (0: none waits)."""
        oldest = [p.oldest_ms for p in self.partitions if p.behind and p.oldest_ms is not None]
        return max(0.0, (self.checked_ms - min(oldest)) / 1000) if oldest else 0.0

    def alarm(self, max_events: int, max_age_s: float) -> str | None:
        """Why the lake is too far behind (None: within the bounds)."""
        if self.oldest_age_s > max_age_s:
            return (f"the oldest of {self.behind} events not in the lake was produced {self.oldest_age_s:.0f} s "
                    f"ago (ingest.lag_alarm_seconds = {max_age_s:.0f})")
        if self.behind > max_events:
            return f"{self.behind} events in Kafka are not in the lake (ingest.lag_alarm_events = {max_events})"
        return None

    def summary(self, cfg: TracerlConfig) -> dict[str, Any]:
        """JSON-shaped: what `tracerl status`, `/health` and the asset check report."""
        why = self.alarm(cfg.ingest.lag_alarm_events, cfg.ingest.lag_alarm_seconds)
        return {"ok": why is None, "alarm": why, "behind": self.behind,
                "oldest_age_s": round(self.oldest_age_s, 1), "topic": self.topic,
                "partitions": {str(p.partition): asdict(p) for p in self.partitions}}


def data_consumer(cfg: TracerlConfig, **options: Any):
    """A consumer outside any group: it is assigned partitions, it never joins."""
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    try:
        servers = client_options(cfg)
        return KafkaConsumer(**servers, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="none",  # a position we did not choose is an error, never a silent skip
                             **options)
    except BrokerError as e:
        raise IngestError(str(e)) from None
    except KafkaError as e:
        raise IngestError(f"Kafka at {cfg.kafka.bootstrap_servers or 'the embedded broker'} is unreachable: "
                          f"{type(e).__name__}: {e}") from None


def topic_id_of(consumer: Any, topic: str) -> dict[str, str]:
    """{topic: its Kafka topic id} (KIP-516, Kafka 2.8+), or {} where the broker has none.

    The lake keys its watermarks by this id, so a topic deleted and created again (offsets
    starting over, e.g. a restarted in-memory broker) is read from its start, not skipped."""
    tid = consumer._client.cluster.topic_id(topic)  # kafka-python keeps it from the metadata response
    return {topic: str(tid)} if tid else {}


def partitions_of(consumer: Any, cfg: TracerlConfig, topic: str) -> list[int]:
    """This worker's partitions: `ingest.partitions`, else every partition of the topic."""
    known = consumer.partitions_for_topic(topic)
    if not known:
        raise IngestError(f"topic {topic!r} does not exist on {client_options(cfg)['bootstrap_servers']}")
    if cfg.ingest.partitions:
        if not set(cfg.ingest.partitions) <= known:
            raise IngestError(f"ingest.partitions {sorted(set(cfg.ingest.partitions) - known)} are not partitions "
                              f"of {topic!r} (it has {sorted(known)})")
        return sorted(cfg.ingest.partitions)
    return sorted(known)


def resume_offsets(consumer: Any, cfg: TracerlConfig, topic: str, topic_ids: dict[str, str],
                   partitions: list[int]) -> dict[int, tuple[int | None, int]]:
    """{partition: (the lake's watermark or None, the offset to read next)}: just past the
    watermark, or the log's start (also where Kafka's retention deleted what the lake never got)."""
    from kafka import TopicPartition

    tps = [TopicPartition(topic, p) for p in partitions]
    begin = consumer.beginning_offsets(tps)
    coords = {p: (topic, topic_ids.get(topic, ""), p) for p in partitions}
    marks = delta.landed(cfg.table_store, coords.values())
    out = {}
    for tp in tps:
        mark = marks.get(coords[tp.partition])
        out[tp.partition] = (mark, max(begin[tp], mark + 1) if mark is not None else begin[tp])
    return out


def lake_lag(cfg: TracerlConfig, topic: str | None = None, probe_s: float = 1.0) -> LakeLag:
    """The lake's lag behind the topic. Raises IngestError when Kafka cannot be read."""
    from kafka import TopicPartition
    from kafka.errors import KafkaError

    topic = topic or cfg.kafka.topic
    consumer = data_consumer(cfg, fetch_max_wait_ms=100, max_partition_fetch_bytes=1 << 20)
    try:
        ids = topic_id_of(consumer, topic) if topic in consumer.topics() else {}
        partitions = partitions_of(consumer, cfg, topic)
        resume = resume_offsets(consumer, cfg, topic, ids, partitions)
        tps = {p: TopicPartition(topic, p) for p in partitions}
        end = consumer.end_offsets(list(tps.values()))
        lag = LakeLag(topic, ids.get(topic, ""), checked_ms=int(time.time() * 1000))
        for p, (mark, at) in resume.items():
            tp = tps[p]
            log_end = read_log_end(consumer, tp, end[tp], probe_s)
            part = PartitionLag(p, mark, at, log_end, max(0, log_end - at))
            if part.behind:
                first = _read_at(consumer, tp, at, probe_s)
                part.oldest_ms = first.timestamp if first is not None else None
            lag.partitions.append(part)
        return lag
    except KafkaError as e:
        raise IngestError(f"Kafka is unreachable while measuring the lake's lag on {topic!r}: "
                          f"{type(e).__name__}: {e}") from None
    finally:
        consumer.close()


def _read_at(consumer: Any, tp: Any, offset: int, seconds: float):
    """The first record of partition ``tp`` at or after ``offset`` (None: none within ``seconds``)."""
    consumer.assign([tp])
    consumer.seek(tp, offset)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        records = consumer.poll(timeout_ms=100).get(tp)
        if records:
            return records[0]
    return None


def read_log_end(consumer: Any, tp: Any, end: int, seconds: float = 1.0) -> int:
    """The offset after the partition's last record. Kafka's end offset is that; the embedded
    broker's is its last batch's base + 1, so the last batch is read to find its true end."""
    if end <= 0:
        return end
    consumer.assign([tp])
    consumer.seek(tp, end - 1)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        records = consumer.poll(timeout_ms=100).get(tp)
        if records:
            return max(end, records[-1].offset + 1)
    return end


class LagWatch:
    """The lake's lag measured every ``interval_s`` on a daemon thread, for a server's health
    report: reading it costs nothing on the request path."""

    def __init__(self, cfg: TracerlConfig, interval_s: float = 30.0):
        import threading

        self.cfg, self.interval_s = cfg, interval_s
        self._latest: dict[str, Any] = {"ok": None, "alarm": None, "note": "not measured yet"}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tracerl-lag", daemon=True)
        self._thread.start()

    def latest(self) -> dict[str, Any]:
        return self._latest

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            try:
                s = lake_lag(self.cfg).summary(self.cfg)
                s.pop("partitions")
                self._latest = s
            except Exception as e:  # noqa: BLE001 - a health report says what failed, it never dies
                self._latest = {"ok": False, "alarm": f"lag unknown: {type(e).__name__}: {e}"[:300]}
            if self._stop.wait(self.interval_s):
                return
