"""The demo's simulated traffic around a loop iteration: the users before it, the swap probe during it.

The loop itself is the Dagster job (assets/loop.py); these are the parts a demo or a benchmark adds
around it, and they only talk to the gateway, as an app would.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import asdict
from typing import Any

from pipelines.config import TracerlConfig
from pipelines.sim.traffic import TrafficConfig, simulate


class SwapProbe:
    """Users that keep sending requests while a swap runs, counting failures."""

    def __init__(self, url: str, key: str, t: TrafficConfig, pref: Any, users: int):
        self.url, self.key, self.t, self.pref, self.users = url, key, t, pref, users
        self._stop = threading.Event()
        self.requests = self.failed = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(users)]

    def _run(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            t = TrafficConfig(**{**asdict(self.t), "requests": 1, "users": 1, "seed": 7_000_000 + i * 10_000 + n})
            s = simulate(self.url, self.key, t, self.pref)
            with self._lock:
                self.requests += s.requests
                self.failed += s.failed

    def __enter__(self) -> "SwapProbe":
        for th in self._threads:
            th.start()
        time.sleep(0.5)  # requests in flight before the swap starts
        return self

    def __exit__(self, *exc: Any) -> None:
        time.sleep(0.5)  # and after it ends
        self._stop.set()
        for th in self._threads:
            th.join(120)


def gateway_url(cfg: TracerlConfig) -> str:
    from pipelines.deploy.service import read_gateway_state

    state = read_gateway_state(cfg)
    if state is None:
        raise RuntimeError("the gateway is not running: `tracerl up` (or `tracerl serve`) first")
    return state.url


def wait_emitted(cfg: TracerlConfig, url: str, timeout: float = 60.0) -> None:
    """Wait until the gateway's emitter has handed every event to Kafka (nothing queued)."""
    from pipelines.deploy.service import admin_key

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        req = urllib.request.Request(f"{url}/admin/stats", headers={"Authorization": f"Bearer {admin_key(cfg)}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            emitter = json.loads(r.read())["emitter"]
        if emitter.get("queued", 0) == 0 and emitter.get("spill_files", 0) == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the gateway's emitter still holds events after {timeout:.0f}s: {emitter}")
