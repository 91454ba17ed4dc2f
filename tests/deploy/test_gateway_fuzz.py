"""Schema-driven API testing: schemathesis reads the gateway's own ``/openapi.json`` and sends
valid (positive) and invalid (negative) requests to every route of a real gateway in front of a
real vLLM, with valid tenant and admin keys. No client input may get a 5xx.

Bounded for 2 cores: ``TRACERL_FUZZ_EXAMPLES`` examples per route and mode (default 50); the
chat schema is narrowed only where generation would be slow or blind (``max_tokens`` <= 4, the
model names that exist, plus one that does not), never where it would hide a route's checks.
"""

from __future__ import annotations

import copy
import os
import time
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from pipelines.deploy.errors import CODES, INVALID_JSON, OPENAI_CODES
from tests.deploy.conftest import ADMIN, KEYS
from tests.deploy.gateway_http import call, is_openai_error

pytestmark = pytest.mark.slow
EXAMPLES = int(os.environ.get("TRACERL_FUZZ_EXAMPLES", "50"))
# every 4xx code is one of errors.py's (OpenAI's own, or the few where OpenAI answers null); a 400,
# a client's mistake in a body, is one of OpenAI's (or invalid_json: not JSON at all)
CODES_400 = OPENAI_CODES | {INVALID_JSON}


def narrowed(doc: dict, trace: dict) -> dict:
    """Cheap outputs, and real names and ids so that generated requests get past the 404s."""
    doc = copy.deepcopy(doc)
    schemas = doc["components"]["schemas"]
    props = schemas["ChatRequest"]["properties"]
    for name in ("max_tokens", "max_completion_tokens"):
        props[name]["anyOf"][0]["maximum"] = 4
    props["model"] = {"type": "string", "enum": ["support", "acme/support", "nope"]}
    # a string that parses to a JSON object is beyond JSON Schema's generators: random text is a
    # 400 (tested in test_gateway_hostile), so positive examples would seldom reach vLLM
    schemas["CalledFunction"]["properties"]["arguments"] = {
        "type": "string", "enum": ["{}", '{"city": "Paris"}', '{"q": [1, 2.5, null], "deep": {"a": "\\u00e9"}}']}
    schemas["TracerlExtension"]["properties"]["trace_id"] = {"enum": [trace["trace_id"], None]}
    for body in ("FeedbackBody", "ToolCallBody", "SessionEndBody"):
        for field in ("trace_id", "turn_id"):
            if field in schemas[body]["properties"]:
                schemas[body]["properties"][field] = {"type": "string", "enum": [trace[field]]}
    return doc


def test_no_route_answers_5xx_to_schema_generated_requests(boundary):
    url, gw = boundary.url, boundary.gateway
    status, doc = call(f"{url}/openapi.json", None)
    assert status == 200
    status, out = call(f"{url}/v1/chat/completions", KEYS["acme"],
                       {"model": "support", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert status == 200, out
    schema = schemathesis.openapi.from_dict(narrowed(doc, out["tracerl"]))
    statuses: dict[str, Counter] = {}
    server_errors: list[str] = []
    bad_format: list[str] = []
    bad_code: list[str] = []  # a 4xx whose code is not in errors.CODES (OpenAI's, or the gateway's few)
    rejected_before = gw.emitter.stats()["rejected"]
    t0 = time.monotonic()
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) == sum(len(methods) for methods in doc["paths"].values()) == 15
    for op in operations:
        key = ADMIN if op.path.startswith(("/admin", "/internal")) else KEYS["acme"]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            seen = statuses.setdefault(f"{op.method.upper()} {op.path} {mode.value}", Counter())

            @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                resp = case.call(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
                seen[resp.status_code] += 1
                if resp.status_code >= 500:
                    server_errors.append(f"{case.method} {case.path} {case.body!r:.300} -> "
                                         f"{resp.status_code} {resp.text[:300]}")
                elif resp.status_code >= 400:
                    if mode is GenerationMode.POSITIVE and os.environ.get("TRACERL_FUZZ_SHOW"):
                        print(case.path, str(case.body)[:200], resp.text[:200])
                    try:
                        body = resp.json()
                        ok = is_openai_error(body)
                    except ValueError:
                        ok = False
                    if ok and (body["error"]["code"] not in (CODES_400 if resp.status_code == 400 else CODES)
                               or body["error"]["type"] not in ("invalid_request_error", "requests")):
                        bad_code.append(f"{case.method} {case.path} -> {resp.status_code} {resp.text[:200]}")
                    if not ok:
                        bad_format.append(f"{case.method} {case.path} -> {resp.status_code} {resp.text[:200]}")

            try:
                run()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, op.path  # a route without inputs has no invalid ones
                statuses.pop(f"{op.method.upper()} {op.path} {mode.value}")
    elapsed = time.monotonic() - t0
    total = sum(sum(c.values()) for c in statuses.values())
    print(f"\nschemathesis: {total} requests in {elapsed:.0f}s, {len(server_errors)} 5xx")
    for name, c in statuses.items():
        print(f"  {name}: {dict(sorted(c.items()))}")
    assert not server_errors, "\n".join(server_errors[:20])
    assert not bad_format, "\n".join(bad_format[:20])
    assert not bad_code, "\n".join(bad_code[:20])
    # the positive chat examples reached vLLM and were recorded; nothing accepted was dropped
    assert statuses["POST /v1/chat/completions positive"][200] > 0
    assert gw.emitter.stats()["rejected"] == rejected_before
