"""What issue #40's durability costs while Kafka is down: each turn on disk before its answer.

1. The emitter alone (no vLLM), its broker killed: C concurrent callers each emit an event and
   wait for its future (written, fsync'd, group commit); events/s, the wait's p50/p99 and events
   per fsync, for C = 1, 8, 64.
2. The gateway with Kafka stopped, as bench/gateway.py runs it (embedded Kafka, vLLM tiny CPU fp32,
   the gateway in its own process, 20 clients, 16 tokens): two gateways on the same vLLM, one as
   shipped ("durable": the answer waits for the fsync) and one answering from memory as before
   issue #40 ("memory": `durable_when_down` and `fsync` off), alternating phases, ROUNDS times.

    .venv/bin/python bench/gateway_outage.py
Last line: durable_vs_memory_ratio=<median of the rounds' req/s ratios>   (1.0: free)
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway import phase  # noqa: E402
from swap import ADMIN, KEYS, _free_port, admin_call, pct, serve_stack  # noqa: E402

from pipelines.config import TracerlConfig  # noqa: E402
from pipelines.config.gateway import GatewayConfig  # noqa: E402

ROUNDS = 5
CALLERS = (1, 8, 64)
EMITTER_S = 3.0


def _memory_gateway_main(cfg: TracerlConfig, gcfg: GatewayConfig) -> None:
    """The gateway as before issue #40: Kafka down, the answer never waits for the disk."""
    from aiohttp import web

    from pipelines.deploy.service import build_gateway

    gateway = build_gateway(cfg, gcfg)
    gateway.emitter.conf.durable_when_down = False
    gateway.emitter.conf.fsync = False
    try:
        web.run_app(gateway.app(), host=gcfg.host, port=gcfg.port, access_log=None, print=None, backlog=1024)
    finally:
        gateway.emitter.close()


def emitter_alone() -> None:
    from pipelines.deploy.emitter import Emitter, EmitterConfig
    from pipelines.ingest.sample import generate
    from pipelines.services.kafka import start_broker, stop_broker

    tmp = Path(tempfile.mkdtemp(prefix="tracerl-outage-"))
    own = TracerlConfig(home=tmp / "kafka")
    port = _free_port()
    start_broker(own, port=port)
    cfg = TracerlConfig(home=tmp / "gw")
    cfg.kafka.bootstrap_servers, cfg.kafka.topic = f"127.0.0.1:{port}", own.kafka.topic
    em = Emitter(cfg, tmp / "spill", EmitterConfig(retry_backoff_s=5.0))
    pool = [e.to_dict() for e in generate(200, seed=1)]
    em.emit(pool[0])
    while em.stats()["sent"] < 1:
        time.sleep(0.05)
    stop_broker(own)
    while not em.health()["kafka_down"]:
        time.sleep(0.01)
    size = sum(len(json.dumps(e)) + 1 for e in pool) / len(pool)
    print(f"emitter alone, Kafka down, {size:.0f} B/event, fsync per group commit:")

    async def run(callers: int) -> None:
        waits: list[float] = []
        stop_at = time.monotonic() + EMITTER_S

        async def caller(i: int) -> None:
            n = i
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                await asyncio.wrap_future(em.emit(pool[n % len(pool)]))
                waits.append(time.perf_counter() - t0)
                n += callers

        commits = em.stats()["commits"]
        t0 = time.monotonic()
        await asyncio.gather(*[caller(i) for i in range(callers)])
        span, groups = time.monotonic() - t0, em.stats()["commits"] - commits
        print(f"  {callers:3d} callers: {len(waits) / span:8.0f} events/s, wait p50 {pct(waits, .5) * 1e6:6.0f} us, "
              f"p99 {pct(waits, .99) * 1e6:6.0f} us, {len(waits) / max(groups, 1):5.1f} events per fsync")

    for callers in CALLERS:
        asyncio.run(run(callers))
    em.close()


def gateways() -> None:
    from pipelines.services.kafka import stop_broker

    with serve_stack(versions=1) as stack:
        gcfg = GatewayConfig(port=_free_port(), api_keys=KEYS, admin_key=ADMIN, upstreams=[stack["vllm"]],
                             instance="memory")
        proc = multiprocessing.get_context("spawn").Process(target=_memory_gateway_main, args=(stack["cfg"], gcfg),
                                                            daemon=True)
        proc.start()
        memory = f"http://127.0.0.1:{gcfg.port}"
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(f"{memory}/health", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.1)
            sides = {"durable": stack["url"], "memory": memory}
            for url in sides.values():
                admin_call(url, "/internal/swap", {"tenant": "acme", "task": "support", "version": 1, "who": "bench"})
            stop_broker(stack["cfg"])
            time.sleep(1.0)
            rates: dict[str, list[float]] = {s: [] for s in sides}
            lat: dict[str, list[float]] = {s: [] for s in sides}
            failed = 0
            print(f"gateway, Kafka stopped: {ROUNDS} rounds, alternating")
            for r in range(ROUNDS):
                for side, url in sides.items():
                    rate, results = asyncio.run(phase(url, KEYS["acme"], "support", {}))
                    rates[side].append(rate)
                    lat[side] += [e - s for s, e, ok, _ in results if ok]
                    failed += sum(1 for x in results if not x[2])
                    print(f"  round {r + 1} {side:7s}: {rate:6.1f} req/s ({len(results)} requests)", flush=True)
            for side, url in sides.items():
                req = urllib.request.Request(f"{url}/admin/stats", headers={"Authorization": f"Bearer {ADMIN}"})
                stats = json.loads(urllib.request.urlopen(req, timeout=10).read())["emitter"]
                print(f"{side:7s}: {statistics.mean(rates[side]):6.1f} req/s, p50 {pct(lat[side], .5) * 1000:.0f} ms, "
                      f"p99 {pct(lat[side], .99) * 1000:.0f} ms; emitter {stats}")
        finally:
            proc.terminate()
            proc.join(15)
    ratios = [d / m for d, m in zip(rates["durable"], rates["memory"])]
    print(f"failed requests: {failed}")
    print("round ratios: " + ", ".join(f"{x:.3f}" for x in ratios))
    print(f"durable_vs_memory_ratio={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    emitter_alone()
    gateways()
