"""Gateway overhead: throughput through the gateway versus straight to vLLM, same load, one run;
and the same with PII redaction on (#42: a tenant's ``privacy.redact_pii``).

Starts embedded Kafka, vLLM (tiny model, CPU fp32) and the gateway (its own process) on
127.0.0.1. 20 concurrent clients, identical requests (chat, up to 16 tokens,
logprobs and token ids: what the gateway asks vLLM for anyway), alternating phases
direct / gateway / gateway_redact, ROUNDS times, so drift hits every side alike. Each figure is
the median of the rounds' ratios (one configuration's single ratio ranged 0.83-0.96 over six
runs). The gateway sides also record every turn to Kafka; `gateway` is tenant acme (no
redaction), `gateway_redact` tenant globex with ``[targets."globex".privacy] redact_pii = true``.
Every side sends the same message, which holds an e-mail address, a phone and a card number (all
three redacted on the redact side, in the recorded input; the reply is scanned too).

    .venv/bin/python bench/gateway.py
Second to last line: gateway_vs_direct_ratio=<median>   (target >= 0.95, #17)
Last line: gateway_redact_vs_direct_ratio=<median>      (the same with redaction on)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from swap import ADMIN, CLIENTS, KEYS, admin_call, client_loop, pct, serve_stack  # noqa: E402

PHASE_S = 10.0   # seconds per phase
ROUNDS = 5       # direct+gateway+gateway_redact rounds; each figure is the median of their ratios
REDACT_KEY = {"globex": "globex-bench-key-0123456789"}
MESSAGES = [{"role": "user", "content": "I am jane.doe@example.com, call me on +44 20 7946 0958 or charge "
                                        "4111 1111 1111 1111. What is the weather in Oslo?"}]


async def phase(url: str, key: str | None, model: str, extra: dict) -> tuple[float, list]:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector

    results: list = []
    async with ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=300)) as session:
        warm_until = time.monotonic() + 2.0  # connections and first batches; not measured
        await asyncio.gather(*[client_loop(session, url, key, model, warm_until, [], extra) for _ in range(CLIENTS)])
        start = time.monotonic()
        await asyncio.gather(*[client_loop(session, url, key, model, start + PHASE_S, results, extra)
                               for _ in range(CLIENTS)])
        span = max(r[1] for r in results) - start
    ok = [r for r in results if r[2]]
    return len(ok) / span, results


def redaction_us() -> float:
    """CPU time of redacting one recorded turn as this bench's requests make it (the message, a
    16-token reply, ids and logprobs), in microseconds: the part of the redact side's cost that
    does not depend on the machine's load (best of 5 runs of 2000 events)."""
    import copy
    import timeit

    from pipelines.contract.events import Message, ModelTurn
    from pipelines.privacy.redact import redact_event

    event = ModelTurn(tenant="globex", app="bench", trace_id="t", task="support", turn_index=0, model="m",
                      input_messages=[Message(**m) for m in MESSAGES], output_text="It is 4 degrees and raining in "
                      "Oslo, with wind from the", output_token_ids=list(range(16)), output_logprobs=[-0.5] * 16,
                      prompt_token_ids=list(range(40))).to_dict()
    times = []
    for _ in range(5):
        events = [copy.deepcopy(event) for _ in range(2000)]  # redacted in place: a fresh copy each
        times.append(timeit.timeit(lambda: [redact_event(e) for e in events], number=1) / len(events))
    assert events[0]["input_messages"][0]["content"].startswith("I am [EMAIL]")
    return min(times) * 1e6


def main() -> None:
    with serve_stack(versions=1, keys=REDACT_KEY, targets={"globex": {"privacy": {"redact_pii": True}}}) as stack:
        for tenant in ("acme", "globex"):
            admin_call(stack["url"], "/internal/swap", {"tenant": tenant, "task": "support", "version": 1, "who": "bench"})
        lp = {"logprobs": True, "return_token_ids": True, "messages": MESSAGES}
        sides = {"direct": (stack["vllm"], None, "acme/support/v1", lp),
                 "gateway": (stack["url"], KEYS["acme"], "support", {"messages": MESSAGES}),
                 "gateway_redact": (stack["url"], REDACT_KEY["globex"], "support", {"messages": MESSAGES})}
        rates: dict[str, list[float]] = {side: [] for side in sides}
        lat: dict[str, list[float]] = {side: [] for side in sides}
        failed = 0
        print(f"{CLIENTS} clients, {ROUNDS} rounds of {PHASE_S:.0f}s per side, 16 tokens per request")
        for r in range(ROUNDS):
            for side, (url, key, model, extra) in sides.items():
                rate, results = asyncio.run(phase(url, key, model, extra))
                rates[side].append(rate)
                lat[side] += [e - s for s, e, ok, _ in results if ok]
                failed += sum(1 for x in results if not x[2])
                print(f"  round {r + 1} {side:14s}: {rate:6.1f} req/s ({len(results)} requests)", flush=True)
        req = urllib.request.Request(f"{stack['url']}/admin/stats", headers={"Authorization": f"Bearer {ADMIN}"})
        stats = json.loads(urllib.request.urlopen(req, timeout=10).read())
    ratios = [g / d for d, g in zip(rates["direct"], rates["gateway"])]
    redact = [g / d for d, g in zip(rates["direct"], rates["gateway_redact"])]
    for side in sides:
        print(f"{side:14s}: {sum(rates[side]) / ROUNDS:6.1f} req/s, {16 * sum(rates[side]) / ROUNDS:6.0f} tokens/s, "
              f"p50 {pct(lat[side], .5) * 1000:.0f} ms, p99 {pct(lat[side], .99) * 1000:.0f} ms")
    print(f"failed requests: {failed}; gateway emitter: {stats['emitter']}; events redacted: "
          f"{stats['gateway']['redacted_events']}")
    print("round ratios, gateway: " + ", ".join(f"{x:.3f}" for x in ratios))
    print("round ratios, gateway_redact: " + ", ".join(f"{x:.3f}" for x in redact))
    print("redact_vs_plain_gateway_ratio="
          f"{statistics.median(g / p for p, g in zip(rates['gateway'], rates['gateway_redact'])):.3f}")
    print(f"redaction CPU per recorded turn (in-process, best of 5): {redaction_us():.1f} us")
    print(f"gateway_vs_direct_ratio={statistics.median(ratios):.3f}")
    print(f"gateway_redact_vs_direct_ratio={statistics.median(redact):.3f}")


if __name__ == "__main__":
    main()
