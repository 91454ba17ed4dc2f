"""The producer SDK customer apps use to emit trace events.

    from pipelines.ingest.producer import TraceProducer
    from pipelines.contract.events import ModelTurn, Feedback

    with TraceProducer.from_config() as traces:
        traces.send(ModelTurn(tenant="acme", app="support", trace_id=tid, ...))
        traces.send(Feedback(tenant="acme", app="support", trace_id=tid,
                             turn_id=turn_id, kind="thumbs", value=1))
    # leaving the block flushes; failed deliveries raise DeliveryError

Sends are asynchronous and batched (acks=all, idempotent). Delivery errors are
never swallowed: each `send` returns a future, an optional `on_error` callback
sees every failure, and `flush()` raises `DeliveryError` listing what failed.
The wire format is plain JSON keyed by trace id, so any Kafka client can
produce the same messages.

An acknowledged send is as durable as the broker: on the embedded in-memory
broker (local use), events not yet ingested are lost when it stops. Unlike the
gateway, this SDK keeps no journal; production uses a replicated cluster.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable

from pipelines.config import TracerlConfig, load_config
from pipelines.contract.events import Event, wire_json
from pipelines.contract.validate import OVERSIZE, ValidationError, validate_event
from pipelines.services.kafka import client_options


class DeliveryError(RuntimeError):
    def __init__(self, failures: list[tuple[str, BaseException]]):
        head = "; ".join(f"{eid}: {err!r}" for eid, err in failures[:5])
        more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(f"{len(failures)} trace event(s) were not delivered: {head}{more}")
        self.failures = failures


def encode(event: Event | dict) -> tuple[bytes, bytes, str]:
    """(key, value, event_id) for one event; validates so bad events fail at the source."""
    obj = event.to_dict() if isinstance(event, Event) else event
    validate_event(obj)
    return obj["trace_id"].encode(), wire_json(obj), obj["event_id"]


class TraceProducer:
    def __init__(
        self,
        cfg: TracerlConfig,
        on_error: Callable[[str, BaseException], None] | None = None,
        validate: bool = True,
        **kafka_options: Any,
    ):
        from kafka import KafkaProducer

        self.topic = cfg.kafka.topic
        self.max_event_bytes = cfg.ingest.max_event_bytes
        self.on_error = on_error
        self.validate = validate
        self._failures: list[tuple[str, BaseException]] = []
        self._lock = threading.Lock()
        options = dict(
            acks="all", enable_idempotence=True, linger_ms=5, batch_size=256 * 1024,
            compression_type=None, retries=5, max_in_flight_requests_per_connection=5,
            # room above the ingest limit, so foreign oversize messages reach quarantine
            max_request_size=2 * cfg.ingest.max_event_bytes + 65536,
        )
        options.update(kafka_options)
        self._producer = KafkaProducer(**client_options(cfg), **options)

    @classmethod
    def from_config(cls, **kwargs: Any) -> "TraceProducer":
        return cls(load_config(), **kwargs)

    def send(self, event: Event | dict):
        """Queue one event; returns kafka-python's future (`.get()` blocks for the result)."""
        if self.validate:
            key, value, event_id = encode(event)
        else:
            obj = event.to_dict() if isinstance(event, Event) else event
            key, value, event_id = obj["trace_id"].encode(), json.dumps(obj).encode(), obj["event_id"]
        if len(value) > self.max_event_bytes:
            raise ValidationError(OVERSIZE, f"event {event_id} is {len(value)} bytes, over the "
                                            f"{self.max_event_bytes}-byte limit (ingest.max_event_bytes)")
        return self.send_raw(key, value, event_id)

    def send_raw(self, key: bytes | None, value: bytes, label: str = "?"):
        """Send bytes as they are (tests and tools that replay raw messages)."""
        future = self._producer.send(self.topic, key=key, value=value)
        future.add_errback(self._failed, label)
        return future

    def _failed(self, label: str, err: BaseException) -> None:
        with self._lock:
            self._failures.append((label, err))
        if self.on_error:
            self.on_error(label, err)

    def flush(self, timeout: float | None = None) -> None:
        self._producer.flush(timeout=timeout)
        with self._lock:
            failures, self._failures = self._failures, []
        if failures:
            raise DeliveryError(failures)

    def close(self, timeout: float | None = None) -> None:
        try:
            self.flush(timeout)
        finally:
            self._producer.close(timeout=timeout)

    def __enter__(self) -> "TraceProducer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
