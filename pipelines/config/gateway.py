"""``[gateway]``: the gateway's settings. Pydantic and the standard library only, so the CLI and
``TracerlConfig`` hold them without importing aiohttp (``tracerl --help`` stays instant)."""

from __future__ import annotations

import re
from dataclasses import field

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION


@dataclass(config=SECTION)
class GatewayConfig:
    """Settings of the gateway (``TracerlConfig.gateway``)."""

    host: str = "127.0.0.1"             # loopback only unless you put TLS and a firewall in front
    port: int | None = 8400             # None = a free port
    api_keys: dict[str, str] = field(default_factory=dict)  # tenant -> API key
    admin_key: str | None = None        # None = generated once into <home>/gateway/admin.key
    upstreams: list[str] = field(default_factory=list)      # vLLM base URLs; [] = the embedded one
    app: str = "gateway"                # ModelTurn.app when the request names none
    request_timeout_s: float = 300.0    # one upstream completion, streaming included
    drain_timeout_s: float = 120.0      # wait for the old version's requests before unloading it
    queue_size: int = 10_000            # emitter: events in memory before spilling to disk
    replay_interval_s: float = 5.0      # emitter: how often spilled events are retried
    max_body_bytes: int = 4 << 20       # a larger request body is a 413
    max_json_depth: int = 32            # deeper nesting in a body is a 400 (ingest and the views read it)
    instance: str = ""                  # one of several gateways on one home: its own routes, swaps, spill
    reconcile_interval_s: float | None = None  # follow the registry itself (10 s for each of several); None:
                                        # only when told (the `deployment` asset, operator actions)
    health_interval_s: float = 1.0      # how often each upstream's /health is probed
    health_timeout_s: float = 2.0       # a probe slower than this failed
    health_failures: int = 2            # failed probes in a row that take an upstream out
    sweep_interval_s: float | None = 30.0  # unload the tracerl names no gateway routes, holds or has
                                        #   requests on (a drain that timed out, two at once); None: off
    lag_interval_s: float = 30.0        # how often the lake's lag behind Kafka is measured for /health

    def __post_init__(self) -> None:
        if self.port is not None and not 0 <= self.port <= 65535:
            raise ValueError(f"gateway.port={self.port} must be in 0..65535, or None for a free one")
        if self.max_body_bytes < 1024 or not 2 <= self.max_json_depth <= 256:
            raise ValueError(f"gateway.max_body_bytes={self.max_body_bytes} must be >= 1024 and "
                             f"gateway.max_json_depth={self.max_json_depth} in 2..256")
        if self.instance and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.instance):
            raise ValueError(f"gateway.instance={self.instance!r} must be 1-64 of [A-Za-z0-9_.-] (a folder name)")
        if self.reconcile_interval_s is not None and self.reconcile_interval_s <= 0:
            raise ValueError(f"gateway.reconcile_interval_s={self.reconcile_interval_s} must be > 0, or unset for off")
        if self.health_interval_s <= 0 or self.health_timeout_s <= 0 or self.health_failures < 1:
            raise ValueError(f"gateway.health_interval_s={self.health_interval_s} and health_timeout_s="
                             f"{self.health_timeout_s} must be > 0, health_failures={self.health_failures} >= 1")
        if self.sweep_interval_s is not None and self.sweep_interval_s <= 0:
            raise ValueError(f"gateway.sweep_interval_s={self.sweep_interval_s} must be > 0, or unset for off")
        if self.queue_size < 1:
            raise ValueError(f"gateway.queue_size={self.queue_size} must be >= 1")
        keys = list(self.api_keys.values()) + ([self.admin_key] if self.admin_key else [])
        if len(set(keys)) != len(keys) or any(len(k) < 16 for k in keys):
            raise ValueError("gateway.api_keys and admin_key must be distinct, at least 16 characters each")
