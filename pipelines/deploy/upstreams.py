"""The vLLM replicas behind a gateway: which serve now, probed, taken out and put back.

A replica is taken out when a request cannot connect to it, or when `gateway.health_failures`
probes of its ``/health`` in a row fail (a probe every `gateway.health_interval_s`); requests go
round-robin over the replicas in, and one that could not reach its replica is sent to another
at once, so a replica that dies fails no request it had not started answering. A replica that
answers its probe again is put back only once the deployer has made it hold the routed adapters
(``Deployer.restore_replica``): a restarted vLLM has none, and would 404 every name.

Shared by the gateway's event loop (pick, mark_down) and the deployer's thread (loads go to
the replicas in; a returning one is put back under the deployer's lock): a ``threading`` lock,
nothing awaited inside it.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable


class NoReplica(RuntimeError):
    """Every vLLM replica was tried for this request."""


@dataclass
class Replica:
    url: str
    serving: bool = True       # in the round-robin
    failures: int = 0          # failed probes in a row
    since: float = 0.0         # when it last went in or out (time.time())
    reason: str = ""           # why it is out (the last probe's or request's error)
    requests: int = 0          # requests sent to it
    taken_out: int = 0         # times it went out


class Upstreams:
    """The replica set; ``serving=False`` marks replicas found down when the gateway started."""

    def __init__(self, urls: Iterable[str], down: dict[str, str] | None = None):
        now, down = time.time(), down or {}
        self._replicas = {u: Replica(u, serving=u not in down, since=now, reason=down.get(u, ""))
                          for u in urls}
        if not self._replicas:
            raise ValueError("a gateway needs at least one vLLM upstream")
        self._order = itertools.cycle(list(self._replicas))
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        return list(self._replicas)

    def serving(self) -> list[str]:
        with self._lock:
            return [u for u, r in self._replicas.items() if r.serving]

    def pick(self, tried: Iterable[str] = ()) -> str:
        """The next replica in the round-robin, skipping those out and those ``tried`` already.
        With every replica out, any not tried yet (a probe can be wrong, a request can only try)."""
        tried = set(tried)
        with self._lock:
            for serving_only in (True, False):
                for _ in range(len(self._replicas)):
                    url = next(self._order)
                    r = self._replicas[url]
                    if (r.serving or not serving_only) and url not in tried:
                        r.requests += 1
                        return url
        raise NoReplica(f"no vLLM replica could be reached (tried {sorted(tried)} of {len(self._replicas)})")

    def mark_down(self, url: str, reason: str) -> bool:
        """Take ``url`` out; True if it was in."""
        with self._lock:
            r = self._replicas[url]
            r.reason = reason[:300]
            if not r.serving:
                return False
            r.serving, r.since, r.taken_out = False, time.time(), r.taken_out + 1
            return True

    def mark_up(self, url: str) -> None:
        """Put ``url`` back (the deployer calls it once the replica holds the routed adapters)."""
        with self._lock:
            r = self._replicas[url]
            if not r.serving:
                r.serving, r.since = True, time.time()
            r.failures, r.reason = 0, ""

    def probed(self, url: str, ok: bool, reason: str, failures_to_out: int) -> str:
        """Record a probe; what it calls for: "back" (ok, but out: restore it), "out" (take it
        out now), or "" (nothing)."""
        with self._lock:
            r = self._replicas[url]
            if ok:
                r.failures = 0
                return "" if r.serving else "back"
            r.failures += 1
            r.reason = reason[:300]
            return "out" if r.serving and r.failures >= failures_to_out else ""

    def stats(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(r) for r in self._replicas.values()]
