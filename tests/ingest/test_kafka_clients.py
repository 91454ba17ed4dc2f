"""Customer apps produce with the Kafka client of their language, not ours: the two most used
besides kafka-python (librdkafka through confluent-kafka, and asyncio's aiokafka) write trace
events to the embedded broker, and one ingest run lands every one of them. Which client versions
were tried against Tansu, and which fail: docs/trace-contract.md "Kafka clients"."""

from __future__ import annotations

import asyncio
import json

import pytest

from pipelines.ingest.producer import encode
from pipelines.ingest.run import run_ingest
from pipelines.ingest.sample import generate
from tests.ingest.test_ingest import lake_payloads


def test_librdkafka_through_confluent_kafka_produces_events_that_land(cfg):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    events = generate(20, seed=31)
    producer = confluent_kafka.Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers,
                                         "enable.idempotence": True, "acks": "all"})
    failures: list = []
    for e in events:
        key, value, _ = encode(e.to_dict())
        producer.produce(cfg.kafka.topic, value=value, key=key,
                         on_delivery=lambda err, _msg: err is not None and failures.append(err))
    assert producer.flush(60) == 0 and failures == []
    r = run_ingest(cfg)
    assert (r.landed, r.quarantined) == (len(events), 0)
    assert lake_payloads(cfg) == {e.event_id: e.to_dict() for e in events}
    assert confluent_kafka.libversion()[1] >= 0x020200ff  # librdkafka 2.2+: what docs/trace-contract.md says works


def test_aiokafka_produces_events_that_land(cfg):
    aiokafka = pytest.importorskip("aiokafka")
    events = generate(20, seed=32)

    async def send() -> None:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=cfg.kafka.bootstrap_servers, acks="all")
        await producer.start()
        try:
            for e in events:
                key, value, _ = encode(e.to_dict())
                await producer.send_and_wait(cfg.kafka.topic, value=value, key=key)
        finally:
            await producer.stop()

    asyncio.run(send())
    r = run_ingest(cfg)
    assert (r.landed, r.quarantined) == (len(events), 0)
    landed = lake_payloads(cfg)
    assert landed == {e.event_id: json.loads(json.dumps(e.to_dict())) for e in events}
