"""The trace-recording gateway: OpenAI-compatible chat in front of vLLM, the only door to it.

Routes (everything else, including vLLM's ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``
and SageMaker-style ``/adapters``, is a 404: the gateway never forwards arbitrary paths):

- ``POST /v1/chat/completions`` (tenant key): ``model`` is a public name (``task`` or
  ``tenant/task``); the router maps it to the live versioned adapter. vLLM is always asked for
  ``logprobs`` and ``return_token_ids``; the client gets them only if it asked. The response
  carries ``tracerl: {trace_id, turn_id, adapter_version}`` and ``X-Tracerl-Trace-Id`` /
  ``X-Tracerl-Turn-Id`` headers; streaming (SSE) puts ``tracerl`` in the first chunk. A
  ``ModelTurn`` with tokens, behaviour logprobs, sampling and latency goes to the emitter
  (never awaited). Optional request field ``tracerl: {trace_id, turn_index, app}`` continues
  a trace.
- ``POST /v1/feedback`` (tenant key): ``{type: feedback|tool_call|session_end, trace_id, ...}``.
- ``GET /v1/models`` (tenant key): this tenant's public names.
- ``POST /admin/deploy {tenant, task, version, who?}``, ``POST /admin/rollback {tenant, task,
  who?}``, ``GET /admin/swaps``, ``GET /admin/stats`` (admin key). ``GET /health``.

Tenancy: a key belongs to one tenant; a tenant sees only its own routes, and trace ids are
signed with the tenant (HMAC), so feedback for another tenant's trace is refused without any
lookup table. Binds 127.0.0.1 unless ``GatewayConfig.host`` says otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections import OrderedDict
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from pipelines.contract.events import EVENT_TYPES, Message, ModelTurn, Sampling
from pipelines.deploy.deployer import Deployer, DeployError, read_swaps
from pipelines.deploy.emitter import Emitter
from pipelines.deploy.gateway_config import GatewayConfig  # noqa: F401 - re-exported
from pipelines.deploy.routing import Router, UnknownModel

ROLES = {"system", "user", "assistant", "tool"}


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class Gateway:
    def __init__(self, gcfg: GatewayConfig, router: Router, deployer: Deployer, emitter: Emitter,
                 secret: bytes, admin_key: str):
        self.gcfg, self.router, self.deployer, self.emitter = gcfg, router, deployer, emitter
        self._secret, self._admin_key = secret, admin_key
        self._tenant_of = {key: tenant for tenant, key in gcfg.api_keys.items()}
        self._next_upstream = itertools.cycle(deployer.upstreams)
        self._turns: OrderedDict[str, int] = OrderedDict()  # trace -> next turn index (bounded)
        self.session: ClientSession | None = None
        self.counts = {"requests": 0, "upstream_errors": 0, "client_disconnects": 0}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 << 20)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/feedback", self.feedback)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/admin/deploy", self.admin_deploy)
        app.router.add_post("/admin/rollback", self.admin_rollback)
        app.router.add_get("/admin/swaps", self.admin_swaps)
        app.router.add_get("/admin/stats", self.admin_stats)
        app.router.add_get("/health", self.health)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        self.session = ClientSession(connector=TCPConnector(limit=0, keepalive_timeout=60),
                                     timeout=ClientTimeout(total=self.gcfg.request_timeout_s))

    async def _close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    # -- auth and trace ids -------------------------------------------------------------------

    def _key(self, request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        return auth[7:].strip() if auth.startswith("Bearer ") else ""

    def _tenant(self, request: web.Request) -> str:
        key = self._key(request)
        tenant = self._tenant_of.get(key)
        if tenant is None or not hmac.compare_digest(self.gcfg.api_keys[tenant], key):
            raise web.HTTPUnauthorized(text=json.dumps({"error": {"message": "a tenant API key is required",
                                                                  "type": "authentication_error"}}),
                                       content_type="application/json")
        return tenant

    def _admin(self, request: web.Request) -> None:
        if not hmac.compare_digest(self._key(request).encode(), self._admin_key.encode()):
            raise web.HTTPForbidden(text=json.dumps({"error": {"message": "the admin key is required",
                                                               "type": "permission_error"}}),
                                    content_type="application/json")

    def _sign(self, tenant: str, raw: str) -> str:
        return hmac.new(self._secret, f"{tenant}:{raw}".encode(), hashlib.sha256).hexdigest()[:16]

    def new_trace_id(self, tenant: str) -> str:
        raw = uuid.uuid4().hex
        return f"{raw}-{self._sign(tenant, raw)}"

    def owns(self, tenant: str, trace_id: str) -> bool:
        raw, _, sig = str(trace_id).rpartition("-")
        return bool(raw) and hmac.compare_digest(sig, self._sign(tenant, raw))

    def _turn_index(self, trace_id: str, given: Any) -> int:
        index = int(given) if given is not None else self._turns.get(trace_id, 0)
        self._turns[trace_id] = index + 1
        self._turns.move_to_end(trace_id)
        while len(self._turns) > 100_000:
            self._turns.popitem(last=False)
        return index

    # -- chat ---------------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        tenant = self._tenant(request)
        try:
            body = await request.json()
            assert isinstance(body, dict) and isinstance(body.get("messages"), list)
        except (ValueError, AssertionError):
            return _error(400, "body must be a JSON object with a 'messages' list")
        ext = body.pop("tracerl", None) or {}
        public = str(body.get("model", ""))
        trace_id = ext.get("trace_id") or request.headers.get("X-Tracerl-Trace-Id")
        if trace_id and not self.owns(tenant, trace_id):
            return _error(404, f"trace {trace_id!r} is not one of this tenant's traces")
        try:
            lease = self.router.acquire(tenant, public)
        except UnknownModel:
            return _error(404, f"model {public!r} does not exist for this key", "not_found_error")
        self.counts["requests"] += 1
        try:
            trace_id = trace_id or self.new_trace_id(tenant)
            turn = {"trace_id": trace_id, "turn_id": uuid.uuid4().hex, "adapter_version": f"v{lease.version}",
                    "turn_index": self._turn_index(trace_id, ext.get("turn_index")),
                    "app": str(ext.get("app") or self.gcfg.app)}
            want = {"logprobs": bool(body.get("logprobs")), "token_ids": bool(body.get("return_token_ids"))}
            upstream = dict(body, model=lease.name, logprobs=True, return_token_ids=True)
            url = next(self._next_upstream) + "/v1/chat/completions"
            headers = {"X-Tracerl-Trace-Id": trace_id, "X-Tracerl-Turn-Id": turn["turn_id"]}
            if body.get("stream"):
                return await self._stream(request, url, upstream, lease, turn, want, headers, public)
            return await self._unary(url, upstream, lease, turn, want, headers, public)
        finally:
            self.router.release(lease)

    def _failed(self, lease) -> None:
        """vLLM answered this request with an error, or not at all (counted per route for swaps)."""
        self.counts["upstream_errors"] += 1
        lease.failed = True

    async def _post(self, url: str, body: dict[str, Any]):
        assert self.session is not None
        return self.session.post(url, json=body)

    async def _unary(self, url, body, lease, turn, want, headers, public) -> web.Response:
        t0 = time.perf_counter()
        try:
            async with await self._post(url, body) as resp:
                data = await resp.json(content_type=None)
                status = resp.status
        except Exception as err:  # noqa: BLE001 - refused, reset, timeout: the client gets a 502
            self._failed(lease)
            return _error(502, f"upstream vLLM failed: {type(err).__name__}: {err}", "upstream_error")
        if status != 200:
            self._failed(lease)
            return web.json_response(data, status=status, headers=headers)
        latency_ms = (time.perf_counter() - t0) * 1000
        choice = data["choices"][0]
        lps = [t["logprob"] for t in (choice.get("logprobs") or {}).get("content") or []]
        self._emit(lease, turn, body, text=choice["message"].get("content") or "",
                   token_ids=list(choice.get("token_ids") or []), logprobs=lps,
                   prompt_ids=data.get("prompt_token_ids"), finish=choice.get("finish_reason"),
                   latency_ms=latency_ms)
        data["model"] = public
        self._strip(data, want)
        data["tracerl"] = {k: turn[k] for k in ("trace_id", "turn_id", "adapter_version")}
        return web.json_response(data, headers=headers)

    @staticmethod
    def _strip(chunk: dict[str, Any], want: dict[str, bool]) -> None:
        if not want["token_ids"]:
            chunk.pop("prompt_token_ids", None)
        for c in chunk.get("choices") or []:
            if not want["logprobs"]:
                c["logprobs"] = None
            if not want["token_ids"]:
                c.pop("token_ids", None)

    async def _stream(self, request, url, body, lease, turn, want, headers, public) -> web.StreamResponse:
        t0 = time.perf_counter()
        text, ids, lps, prompt_ids, finish = [], [], [], None, None
        try:
            ctx = await self._post(url, body)
            up = await ctx.__aenter__()
        except Exception as err:  # noqa: BLE001
            self._failed(lease)
            return _error(502, f"upstream vLLM failed: {type(err).__name__}: {err}", "upstream_error")
        try:
            if up.status != 200:
                self._failed(lease)
                return web.json_response(await up.json(content_type=None), status=up.status, headers=headers)
            resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
            await resp.prepare(request)
            first = True
            async for line in up.content:
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                prompt_ids = prompt_ids or chunk.get("prompt_token_ids")
                for c in chunk.get("choices") or []:
                    text.append((c.get("delta") or {}).get("content") or "")
                    ids.extend(c.get("token_ids") or [])
                    lps.extend(t["logprob"] for t in (c.get("logprobs") or {}).get("content") or [])
                    finish = c.get("finish_reason") or finish
                chunk["model"] = public
                self._strip(chunk, want)
                if first:
                    chunk["tracerl"] = {k: turn[k] for k in ("trace_id", "turn_id", "adapter_version")}
                    first = False
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.counts["client_disconnects"] += 1
            raise
        except Exception:  # the upstream broke off mid-stream
            self._failed(lease)
            raise
        finally:
            await ctx.__aexit__(None, None, None)
        self._emit(lease, turn, body, text="".join(text), token_ids=ids, logprobs=lps, prompt_ids=prompt_ids,
                   finish=finish, latency_ms=(time.perf_counter() - t0) * 1000)
        return resp

    def _emit(self, lease, turn, body, *, text, token_ids, logprobs, prompt_ids, finish, latency_ms) -> None:
        messages = [Message(role=m.get("role") if m.get("role") in ROLES else "system",
                            content=_text(m.get("content")), name=m.get("name"),
                            tool_call_id=m.get("tool_call_id"))
                    for m in body["messages"] if isinstance(m, dict)]
        sampling = Sampling(temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                            top_k=body.get("top_k"), max_tokens=body.get("max_tokens") or body.get("max_completion_tokens"),
                            seed=body.get("seed"))
        event = ModelTurn(tenant=lease.tenant, app=turn["app"], trace_id=turn["trace_id"], task=lease.task,
                          turn_id=turn["turn_id"], turn_index=turn["turn_index"], model=lease.name,
                          adapter_version=turn["adapter_version"], input_messages=messages, output_text=text,
                          output_token_ids=token_ids, output_logprobs=logprobs, prompt_token_ids=prompt_ids,
                          sampling=sampling, finish_reason=finish, latency_ms=round(latency_ms, 2))
        self.emitter.emit(event.to_dict())

    # -- feedback, models ---------------------------------------------------------------------

    async def feedback(self, request: web.Request) -> web.Response:
        from pipelines.contract.validate import ValidationError, validate_event

        tenant = self._tenant(request)
        try:
            body = await request.json()
            kind = body.pop("type", "feedback")
            cls = EVENT_TYPES[kind]
            assert kind != "model_turn"
        except (ValueError, KeyError, AssertionError, AttributeError):
            return _error(400, "body must be a JSON object with type feedback, tool_call or session_end")
        if not self.owns(tenant, body.get("trace_id", "")):
            return _error(404, f"trace {body.get('trace_id')!r} is not one of this tenant's traces")
        body.pop("tenant", None)  # the key decides the tenant, never the body
        body.setdefault("app", self.gcfg.app)
        try:
            event = cls(tenant=tenant, **body).to_dict()
            validate_event(event)
        except (TypeError, ValidationError) as err:
            return _error(400, f"invalid {kind}: {err}")
        self.emitter.emit(event)
        return web.json_response({"event_id": event["event_id"], "trace_id": event["trace_id"]}, status=202)

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": self.router.public_models(self._tenant(request))})

    # -- admin --------------------------------------------------------------------------------

    async def _admin_swap(self, request: web.Request, action: str) -> web.Response:
        self._admin(request)
        try:
            body = await request.json()
            tenant, task, who = str(body["tenant"]), str(body["task"]), str(body.get("who") or "admin")
            args = (tenant, task, int(body["version"])) if action == "deploy" else (tenant, task)
        except (ValueError, KeyError, TypeError):
            return _error(400, "body needs tenant, task (and version for deploy)")
        fn = self.deployer.promote if action == "deploy" else self.deployer.rollback
        try:
            record = await asyncio.to_thread(fn, *args, who)
        except DeployError as err:
            return _error(409, str(err), "deploy_error")
        return web.json_response(record)

    async def admin_deploy(self, request: web.Request) -> web.Response:
        return await self._admin_swap(request, "deploy")

    async def admin_rollback(self, request: web.Request) -> web.Response:
        return await self._admin_swap(request, "rollback")

    async def admin_swaps(self, request: web.Request) -> web.Response:
        self._admin(request)
        return web.json_response(read_swaps(self.deployer.swaps_path, int(request.query.get("limit", 100))))

    async def admin_stats(self, request: web.Request) -> web.Response:
        self._admin(request)
        routes = [{"tenant": r.tenant, "task": r.task, "version": r.version, "inflight": self.router.inflight(r.name),
                   **dict(zip(("requests", "failed_requests"), self.router.ended(r.tenant, r.task)))}
                  for r in self.router.routes()]
        return web.json_response({"gateway": self.counts, "emitter": self.emitter.stats(), "routes": routes})
