"""Zero-failure hot swap: 20 concurrent clients for >= 60 s through the gateway while the
admin API promotes 5 new adapter versions and rolls back once.

Starts its own embedded Kafka, vLLM (tiny model, CPU fp32) and gateway (a separate process),
all on 127.0.0.1, and stops them. Prints requests served and failed, and p50/p99 latency of
requests that overlapped a swap window (admin call start to its end, drain and unload included)
versus those that did not.

    .venv/bin/python bench/swap.py
Last line: swap_failed_requests=<n>   (target 0)
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import shutil
import socket
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.adapters.version import label  # noqa: E402
from pipelines.config import TracerlConfig  # noqa: E402
from pipelines.config.gateway import GatewayConfig  # noqa: E402

CLIENTS = 20           # concurrent clients
DURATION_S = 66.0      # load phase; swaps happen inside it
MAX_TOKENS = 16        # per request: the tiny model's random weights almost never sample EOS, so nearly all run to it
KEYS = {"acme": "acme-bench-key-0123456789"}
ADMIN = "admin-bench-key-0123456789"
PROMPT = [{"role": "user", "content": "What is the weather in Oslo?"}]


def make_adapter(base: Path, out: Path, seed: int, r: int = 8) -> Path:
    """A PEFT LoRA (q/k/v/o) with random B, saved as safetensors (PEFT's B=0 would be a no-op)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                           LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    return out


def _gateway_main(cfg: TracerlConfig, gcfg: GatewayConfig) -> None:
    from pipelines.deploy.service import serve

    serve(cfg, gcfg, backlog=1024)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_stack(versions: int, keys: dict[str, str] | None = None,
                targets: dict[str, dict] | None = None) -> Iterator[dict]:
    """Kafka + vLLM + ``versions`` published adapters of acme/support + a gateway process.
    ``keys``: more tenants (tenant -> API key), each with one version of ``<tenant>/support``;
    ``targets``: the config's per-target settings (``[targets]``)."""
    from pipelines.deploy.vllm_server import start_vllm, stop_vllm
    from pipelines.models.registry import base_model_hash
    from pipelines.models.tiny import make_tiny_llama
    from pipelines.services.kafka import start_broker, stop_broker
    from pipelines.adapters.store import AdapterStore

    tmp = Path(tempfile.mkdtemp(prefix="tracerl-bench-"))
    cfg = TracerlConfig(home=tmp / "home", targets=targets or {})
    keys = {**KEYS, **(keys or {})}
    proc = None
    try:
        t0 = time.monotonic()
        start_broker(cfg, port=None)
        base = make_tiny_llama(tmp / "tiny", warmup_steps=20)
        vllm = start_vllm(base, home=tmp / "vllm", port=None, max_loras=4, max_lora_rank=16, max_cpu_loras=8,
                          dtype="float32", start_timeout_s=240)
        store, h = AdapterStore(cfg.adapter_root), base_model_hash(base)
        meta = {"parent_version": None, "base_model_hash": h, "data_window": None, "reward_spec_version": None,
                "config": {}, "metrics": {}}
        for v in range(1, versions + 1):
            store.publish("acme", "support", make_adapter(base, tmp / f"src-{v}", seed=v), meta)
        for i, tenant in enumerate(t for t in keys if t != "acme"):
            store.publish(tenant, "support", make_adapter(base, tmp / f"src-{tenant}", seed=100 + i), meta)
        gcfg = GatewayConfig(port=_free_port(), api_keys=keys, admin_key=ADMIN, upstreams=[vllm.base_url])
        proc = multiprocessing.get_context("spawn").Process(target=_gateway_main, args=(cfg, gcfg), daemon=True)
        proc.start()
        url = f"http://127.0.0.1:{gcfg.port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        print(f"stack up in {time.monotonic() - t0:.1f}s: vLLM {vllm.base_url}, gateway {url}, {versions} versions")
        yield {"cfg": cfg, "url": url, "vllm": vllm.base_url, "tmp": tmp}
    finally:
        if proc is not None:
            proc.terminate()
            proc.join(15)
        stop_vllm(tmp / "vllm")
        stop_broker(cfg)
        shutil.rmtree(tmp, ignore_errors=True)


def admin_call(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


async def client_loop(session, url: str, key: str, model: str, stop_at: float, out: list, extra: dict) -> None:
    # No `ignore_eos`: the gateway takes the OpenAI request fields only and refuses vLLM's extensions
    # with a 400 (found here: the hardened gateway failed every request of this bench while it sent one).
    body = {"model": model, "messages": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 1.0, **extra}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    while time.monotonic() < stop_at:
        t0 = time.monotonic()
        try:
            async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
                data = await resp.json(content_type=None)
                ok = resp.status == 200
                version = (data.get("tracerl") or {}).get("adapter_version") if ok else f"HTTP {resp.status}: {data}"
        except Exception as err:  # noqa: BLE001 - a failed request is what we count
            ok, version = False, f"{type(err).__name__}: {err}"
        out.append((t0, time.monotonic(), ok, version))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run_load(url: str, swaps: list[tuple[float, str, dict]]) -> tuple[list, list]:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector

    results: list = []
    windows: list = []
    start = time.monotonic()
    stop_at = start + DURATION_S
    async with ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=300)) as session:
        tasks = [asyncio.create_task(client_loop(session, url, KEYS["acme"], "support", stop_at, results, {}))
                 for _ in range(CLIENTS)]
        for at, path, body in swaps:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            t0 = time.monotonic()
            rec = await asyncio.to_thread(admin_call, url, path, body)
            windows.append((t0, time.monotonic()))
            print(f"  t={t0 - start:5.1f}s {rec['action']:8s} {rec['from']} -> {rec['to']}: "
                  f"load {rec.get('load_s')}s, drain {rec.get('drain_s')}s, unloaded {rec.get('unloaded')}, "
                  f"window {windows[-1][1] - t0:.2f}s", flush=True)
        await asyncio.gather(*tasks)
    return results, windows


def main() -> None:
    # the swap primitive itself (what reconcile calls), not the registry: v2..v6, then back to v5
    swaps = [(6.0 + 9.0 * i, "/internal/swap", {"tenant": "acme", "task": "support", "version": v, "who": "bench"})
             for i, v in enumerate(range(2, 7))]
    swaps.append((56.0, "/internal/swap", {"tenant": "acme", "task": "support", "version": 5, "who": "bench"}))
    with serve_stack(versions=6) as stack:
        admin_call(stack["url"], "/internal/swap", {"tenant": "acme", "task": "support", "version": 1, "who": "bench"})
        print(f"{CLIENTS} clients for {DURATION_S:.0f}s, max_tokens={MAX_TOKENS}; 5 swaps up and 1 back:")
        results, windows = asyncio.run(run_load(stack["url"], swaps))
    failed = [r for r in results if not r[2]]
    inside = [e - s for s, e, ok, _ in results if ok and any(s < we and e > ws for ws, we in windows)]
    outside = [e - s for s, e, ok, _ in results if ok and not any(s < we and e > ws for ws, we in windows)]
    versions: dict[int, int] = {}  # the response's tracerl.adapter_version -> requests
    for r in results:
        if r[2]:
            versions[r[3]] = versions.get(r[3], 0) + 1
    span = max(r[1] for r in results) - min(r[0] for r in results)
    print(f"requests served: {len(results) - len(failed)} ({(len(results) - len(failed)) / span:.1f}/s over {span:.1f}s); "
          f"failed: {len(failed)}")
    print(f"served per version: { {label(v): n for v, n in sorted(versions.items())} }")
    for s, e, _, why in failed[:5]:
        print(f"  failed: {why}")
    print(f"latency inside swap windows  (n={len(inside)}): p50 {pct(inside, .5) * 1000:.0f} ms, "
          f"p99 {pct(inside, .99) * 1000:.0f} ms")
    print(f"latency outside swap windows (n={len(outside)}): p50 {pct(outside, .5) * 1000:.0f} ms, "
          f"p99 {pct(outside, .99) * 1000:.0f} ms")
    print(f"swap_failed_requests={len(failed)}")


if __name__ == "__main__":
    main()
