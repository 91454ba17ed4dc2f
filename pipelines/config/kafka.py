"""``[kafka]``: where trace events flow."""

from __future__ import annotations

from typing import Any

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION

# kafka-python settings passed through unchanged when set (security and tuning).
KAFKA_PASSTHROUGH = (
    "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
    "sasl_kerberos_service_name", "ssl_cafile", "ssl_certfile", "ssl_keyfile",
    "ssl_password", "ssl_check_hostname", "client_id", "request_timeout_ms",
)


@dataclass(config=SECTION)
class KafkaConfig:
    """Where trace events flow. `bootstrap_servers=None` means the embedded Tansu broker."""

    bootstrap_servers: str | None = None
    topic: str = "tracerl.events"
    partitions: int = 4                  # used only when tracerl creates the topic
    replication_factor: int = 1          # likewise; use 3 on a real cluster
    group_id: str = "tracerl-ingest"
    embedded_port: int = 19092           # first port tried for the embedded broker
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    sasl_kerberos_service_name: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = None
    ssl_check_hostname: bool | None = None
    client_id: str | None = None
    request_timeout_ms: int | None = None

    @property
    def embedded(self) -> bool:
        return not self.bootstrap_servers

    def security_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in KAFKA_PASSTHROUGH if getattr(self, k) is not None}
