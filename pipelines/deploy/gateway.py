"""The trace-recording gateway: OpenAI-compatible chat in front of vLLM, the only door to it.

Routes (everything else, including vLLM's ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``
and SageMaker-style ``/adapters``, is a 404: the gateway never forwards arbitrary paths):

- ``POST /v1/chat/completions`` (tenant key): ``model`` is a public name (``task`` or
  ``tenant/task``); the router maps it to the live versioned adapter. vLLM is always asked for
  ``logprobs`` and ``return_token_ids``; the client gets them only if it asked. The response
  carries ``tracerl: {trace_id, turn_id, turn_ids, adapter_version, train}`` (the version an int, 3
  for the store's ``v3``) and ``X-Tracerl-Trace-Id`` / ``X-Tracerl-Turn-Id`` headers; streaming (SSE)
  puts ``tracerl`` in the first chunk. ``n`` (1 to ``schemas.MAX_N``, streamed or not) samples
  several answers: each choice is a turn of its own, ``choices[i].turn_id`` (``turn_ids[i]``; the
  header and ``turn_id`` are choice 0's), recorded as its own ``ModelTurn`` with its own tokens and
  logprobs, all with the same trace, turn index and input: a group of samples of one prompt, as
  the learner groups them (identical input messages) for its group baseline. A
  ``ModelTurn`` with tokens, behaviour logprobs, sampling and latency goes to the emitter
  (awaited only while Kafka is down: then it is on disk before the answer, or before a stream's
  ``[DONE]``; see ``emitter.py``); ``tracerl.train`` in the response echoes the flag the turn was recorded
  with. Optional request field ``tracerl: {trace_id, turn_index, app, train}``
  continues a trace; ``train: false`` (or the header ``X-Tracerl-Train: false``) records the
  turn with ``train: false``: it lands and gets rewards, the learner never trains on it
  (evaluation traffic, users without consent). Anything but a JSON boolean there, or anything
  but true/false in the header, or the two disagreeing, is a 400 naming the field.
- The end user (docs/privacy.md): OpenAI's ``user`` field, or the header ``X-Tracerl-User`` for
  apps that cannot set it (the body wins when both are sent), is recorded on every event the
  request makes (the turn, the tool outcomes it carries) as the tenant's keyed pseudonym
  (``pipelines.privacy.pseudonym``: ``u_`` + 32 hex), never in clear; feedback, tool calls and
  session ends posted to ``/v1/feedback`` carry the one they name (body or header), else the one
  their trace's turns had (remembered for the last 100k traces). Empty, over 256 characters, or
  holding a control character: a 400 naming ``user`` or the header. With the tenant's
  ``privacy.redact_pii``, e-mail addresses, phone, card and IBAN numbers are replaced by
  placeholders in what is recorded (``pipelines.privacy.redact``), never in the answer.
- Tools: ``tools`` (OpenAI function tools) with ``tool_choice`` "auto" (the default) are rendered
  into the system prompt, hermes style (``pipelines.contract.tool_calls``), and the reply is
  parsed: well-formed ``<tool_call>`` calls come back as ``message.tool_calls`` (arguments a JSON
  string), ``content`` the text outside them or null, ``finish_reason: "tool_calls"``; a reply
  with any malformed call comes back as the model's plain text. The ModelTurn records what the
  engine saw and did: the rendered messages, the raw output text, tokens, logprobs and vLLM's
  own finish reason. With ``stream`` and tools the reply is sent when it is complete (a call
  cannot be told from prose until it is), as OpenAI-shaped chunks. ``tool_choice: "none"``
  serves the messages without the tools. ``"required"`` or a named function forces a call
  without guided decoding: the assistant turn is prefilled with the call's opening
  (``ChatRequest.prefix``; vLLM continues it), the prefix is part of the recorded prompt (the
  final input message, and ``prompt_token_ids``), the sampled continuation is the turn's output
  with its logprobs, and the reply (``tool_calls``, or the text when the call is malformed) is
  parsed from prefix + continuation.
  Call ids name the turn that made them (``call_<i>_<turn id>``): on a request that continues
  the trace, each ``tool`` message answering one of them is recorded as that turn's
  ``tool_call`` event with its outcome (``tool_results``: invalid arguments by the tool's
  schema, an ``error`` in a JSON result, else ok), once per call however often it is resent.
- ``POST /v1/feedback`` (tenant key): ``{type: feedback|tool_call|session_end, trace_id, ...}``.
- ``GET /v1/models`` (tenant key): this tenant's public names, each with ``version``: the adapter
  version serving it, an int like every turn's ``adapter_version`` (4, never the store's ``v4``).
- ``POST /admin/deploy {tenant, task, version, who?, why, force?}`` and ``POST /admin/rollback
  {tenant, task, who?, why}`` (admin key) are ``tracerl deploy | rollback``: they move the
  registry's ``champion`` alias with who and why, then reconcile this gateway to it in-process
  (``operations``, with ``deployer.promote`` as the swap: no HTTP call back into itself), so the
  next ``deployment`` run changes nothing. ``POST /internal/swap {tenant, task, version, who?}``
  is the reconciler's swap primitive (``service.swap``), not an operator route: it swaps without
  reading the registry, and a swap the alias does not name is undone by the next reconcile.
  ``GET /admin/swaps?limit=``, ``GET /admin/stats`` (admin key).
- Users' data rights (issue #42, docs/privacy.md): ``POST /admin/forget {tenant, user, who?}`` files a
  forget request (202) for ``forget_job``; ``POST /admin/consent {tenant, user, consent, reason?, who?}``
  records a training opt-out or opt-in. The admin key, or the tenant's own key for its own users.
- Canary (admin key, issue #15): ``POST /admin/canary {tenant, task, version, share?, who?, why}``
  loads a challenger that serves ``share`` (default ``canary.share``) of the route's conversations,
  sticky per ``user`` (the OpenAI field) or else per trace; ``POST /admin/canary/share`` changes the
  share, ``POST /admin/canary/stop`` sends all traffic back to the champion and unloads the
  challenger once its requests ended; ``GET /admin/canary`` lists them. Each turn records its
  ``arm``. The canary is part of the route (routes.json), so a restarted gateway restores it. ``GET /health`` (503 when the
  emitter is dead or no vLLM replica serves), ``GET /openapi.json`` (this API, generated from ``schemas.py``).
- Several gateways (``gateway.instance``, ``reconcile_interval_s``): each serves from its own
  router (``<home>/gateways/<instance>/``) and reconciles itself to the registry every
  ``reconcile_interval_s`` (champions and canaries, ``reconcile_now``), so an alias moved by the
  gate or an operator is served by all of them within one interval; ``GET /admin/stats`` says
  what the last reconcile changed.
- Replicas (``gateway.upstreams``, ``upstreams.py``): requests go round-robin over the replicas
  serving; each one's ``/health`` is probed every ``health_interval_s``; a replica failing
  ``health_failures`` probes, or refusing a connection, is taken out and its requests go to the
  others (one that could not reach its replica, or lost it before any answer, is sent to the
  next at once); it is put back when it answers again and holds the routed adapters.

Validation at the door: every body is parsed as strict JSON (``json_body``: size, depth, finite
numbers, encodable strings), checked against its schema (``schemas``), and the event it makes
is checked by the contract validator and the event size limit *before* vLLM is called or the
event is queued. What the emitter or ingest would refuse is a 4xx here, never accepted and
dropped; every error is OpenAI's ``{"error": {message, type, param, code}}`` (``errors``).

Tenancy: a key belongs to one tenant; a tenant sees only its own routes. Keys are configured
(``gateway.api_keys``) or files under ``<home>/gateway/keys/``, which the gateway follows while it
runs (``keys.KeyRing``): a tenant added by ``tracerl tenant add`` chats at once, a deleted key
file stops working. Trace ids are signed
with the tenant, and turn ids with the tenant and their trace (HMAC, a separate key), so
feedback or a tool call naming another tenant's trace or turn, or a turn of another trace, is
refused with 404 without any lookup table. Binds 127.0.0.1 unless ``GatewayConfig.host`` says
otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time
import uuid
from collections import OrderedDict
from typing import Any

from aiohttp import (ClientConnectionError, ClientConnectorError, ClientPayloadError, ClientSession, ClientTimeout,
                     ServerTimeoutError, TCPConnector, web)

from pipelines.adapters.version import parse_version
from pipelines.contract.events import EVENT_TYPES, Message, ModelTurn, Sampling, ToolCall, wire_json
from pipelines.contract.tool_calls import parse_tool_calls
from pipelines.deploy.tool_results import call_id, tool_results
from pipelines.contract.validate import ValidationError
from pipelines.deploy import operations, schemas
from pipelines.deploy.deployer import Deployer, DeployError, read_swaps
from pipelines.deploy.emitter import Emitter
from pipelines.ingest.offsets import LagWatch
from pipelines.deploy import errors as E
from pipelines.deploy.errors import ApiError, error_response, errors_as_json
from pipelines.config.gateway import GatewayConfig
from pipelines.deploy.json_body import parse_json
from pipelines.deploy.keys import KeyRing
from pipelines.deploy.routing import Router, UnknownModel
from pipelines.deploy.schemas import ChatRequest, parse
from pipelines.deploy.upstreams import NoReplica
from pipelines.privacy.policy import Privacy

TRAIN_HEADER = schemas.TRAIN_HEADER  # "false": record the turn as never to be trained on
USER_HEADER = schemas.USER_HEADER    # the end user, for apps that cannot set the body's `user`
ECHOED = ("trace_id", "turn_id", "adapter_version", "train")  # the response's `tracerl` block
BYTES_PER_OUTPUT_TOKEN = 64    # an output token's share of the event: text, id, logprob (JSON)
DEFAULT_OUTPUT_TOKENS = 4096   # the room kept for the output when the request sets no limit
UPSTREAM_KEEPALIVE_S = 2.0     # idle upstream connections close before vLLM's 5 s keep-alive does
# event field -> request field, to name the client's field when the contract refuses an event
_EVENT_TO_REQUEST = [(re.compile(r"^input_messages"), "messages"), (re.compile(r"^sampling\."), ""),
                     (re.compile(r"^(trace_id|turn_index|app)\b"), r"tracerl.\1")]


def _contract_param(err: ValidationError, chat: bool) -> str | None:
    """The field a contract ValidationError names (its detail starts with the path)."""
    m = re.match(r"[A-Za-z_][\w.\[\]]*", err.detail)
    if not m or m.group(0) in ("message", "event", "an", "type"):
        return None
    param = {"rating": "value", "thumbs": "value"}.get(m.group(0), m.group(0))
    for pattern, repl in _EVENT_TO_REQUEST if chat else []:
        param = pattern.sub(repl, param)
    return param


def tool_reply(text: str, turn_id: str) -> dict[str, Any] | None:
    """The OpenAI message for a reply that calls tools: ``{content, tool_calls}``, or None when it
    makes no call or any call is malformed (then the app gets the model's text as it is). Names
    and arguments are passed on as the model wrote them. Each call's id names the turn
    (``tool_results.call_id``): the app's ``tool`` message answering it becomes that turn's
    tool outcome."""
    parsed = parse_tool_calls(text)
    if not parsed.calls or any(c.error is not None for c in parsed.calls):
        return None
    calls = [{"id": call_id(i, turn_id), "type": "function",
              "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
             for i, c in enumerate(parsed.calls)]
    return {"content": parsed.content or None, "tool_calls": calls}


# What an OpenAI chat completion (or chunk) and its choices carry; anything else vLLM adds is dropped.
OPENAI_FIELDS = frozenset({"id", "object", "created", "model", "choices", "usage", "system_fingerprint",
                           "service_tier"})
OPENAI_CHOICE_FIELDS = frozenset({"index", "message", "delta", "logprobs", "finish_reason"})  # + our turn_id


class Gateway:
    def __init__(self, gcfg: GatewayConfig, router: Router, deployer: Deployer, emitter: Emitter,
                 secret: bytes, admin_key: str, keys: KeyRing | None = None):
        self.gcfg, self.router, self.deployer, self.emitter = gcfg, router, deployer, emitter
        self.cfg = emitter.cfg  # the stack's config: the registry /admin/deploy and /admin/rollback move
        self._secret, self._admin_key = secret, admin_key
        self._turn_secret = hmac.new(secret, b"tracerl turn ids", hashlib.sha256).digest()  # not a trace key
        self.keys = keys or KeyRing(gcfg.api_keys, None)  # configured keys only, unless given a folder
        self.upstreams = deployer.upstreams  # the vLLM replicas: probed, taken out, restored, put back
        self._tasks: list[asyncio.Task] = []  # the health probes and the reconcile loop
        self.last_reconcile: dict[str, Any] = {}
        self._turns: OrderedDict[str, int] = OrderedDict()  # trace -> next turn index (bounded)
        self._trace_users: OrderedDict[str, str] = OrderedDict()  # trace -> its user's pseudonym (bounded)
        self.privacy = Privacy(self.cfg)  # pseudonyms, and PII redaction where a tenant asks for it
        self._openapi = schemas.openapi()
        self.max_event_bytes = emitter.cfg.ingest.max_event_bytes
        self.session: ClientSession | None = None
        self.lake_lag: LagWatch | None = None
        self.counts = {"requests": 0, "upstream_errors": 0, "upstream_retries": 0, "client_disconnects": 0,
                       "reconciles": 0, "reconcile_swaps": 0, "reconcile_errors": 0, "swept": 0, "sweep_errors": 0,
                       "prompt_ids_dropped": 0, "tool_results": 0, "tool_results_not_ours": 0, "record_errors": 0,
                       "redacted_events": 0}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.gcfg.max_body_bytes, middlewares=[errors_as_json])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/feedback", self.feedback)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.model)
        app.router.add_post("/admin/deploy", self.admin_deploy)
        app.router.add_post("/admin/rollback", self.admin_rollback)
        app.router.add_post("/internal/swap", self.internal_swap)
        app.router.add_get("/admin/swaps", self.admin_swaps)
        app.router.add_get("/admin/stats", self.admin_stats)
        app.router.add_post("/admin/canary", self.admin_canary_start)
        app.router.add_get("/admin/canary", self.admin_canaries)
        app.router.add_post("/admin/canary/share", self.admin_canary_share)
        app.router.add_post("/admin/canary/stop", self.admin_canary_stop)
        app.router.add_post("/admin/forget", self.admin_forget)
        app.router.add_post("/admin/consent", self.admin_consent)
        app.router.add_get("/health", self.health)
        app.router.add_get("/openapi.json", self.openapi)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        # An idle pooled connection must be dropped here before vLLM drops it (its uvicorn closes idle
        # connections after VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default): reusing one the server is
        # closing at that moment is a 502 "Server disconnected" (at 60 s: 2 of 4 runs of test_traffic).
        self.session = ClientSession(connector=TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S),
                                     timeout=ClientTimeout(total=self.gcfg.request_timeout_s))
        self._tasks.append(asyncio.create_task(self._probe_loop()))
        # the lake's lag behind Kafka, for /health's body (measured off the request path)
        self.lake_lag = LagWatch(self.cfg, self.gcfg.lag_interval_s)
        if self.gcfg.reconcile_interval_s:
            self._tasks.append(asyncio.create_task(self._reconcile_loop()))
        if self.gcfg.sweep_interval_s:
            self._tasks.append(asyncio.create_task(self._sweep_loop()))

    async def _close(self, _app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        if self.lake_lag is not None:
            self.lake_lag.close()
        if self.session is not None:
            await self.session.close()

    # -- following the registry: what several gateways share -------------------------------------

    @property
    def who(self) -> str:
        return f"gateway {self.gcfg.instance}".strip()

    def handle(self):
        """This gateway as reconcile acts on it: its router, swap and canary primitives."""
        from pipelines.deploy.reconcile import GatewayHandle

        return GatewayHandle(self.router, self.deployer.promote, self.deployer.start_canary,
                             self.deployer.stop_canary, self.deployer.set_share)

    def reconcile_now(self):
        """This gateway to the registry (pipelines/deploy/reconcile.py): each target's champion, and
        its canary, through this gateway's own router and deployer. Every gateway on the registry
        runs it, so they serve the same versions within ``reconcile_interval_s`` of an alias move."""
        from pipelines.deploy.reconcile import reconcile

        return reconcile(self.cfg, who=f"{self.who} reconcile", gateway=self.handle())

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(float(self.gcfg.reconcile_interval_s or 0))
            try:
                report = await asyncio.to_thread(self.reconcile_now)
            except Exception as err:  # noqa: BLE001 - the registry unreachable: keep serving, retry next tick
                self.counts["reconcile_errors"] += 1
                self.last_reconcile = {"at": time.time(), "error": f"{type(err).__name__}: {err}"[:500]}
                continue
            self.counts["reconciles"] += 1
            self.counts["reconcile_swaps"] += len(report.of("swapped"))
            changed = [t.line() for t in report.targets
                       if t.outcome in ("swapped", "failed") or (t.canary and not t.canary.endswith("in sync"))]
            self.last_reconcile = {"at": time.time(), "changed": changed}
            for line in changed:
                print(f"{self.who} reconcile: {line}", flush=True)

    # -- the replicas: health probes, take out, restore, put back (upstreams.py) ---------------

    async def _probe(self, url: str) -> tuple[bool, str]:
        assert self.session is not None
        try:
            async with self.session.get(f"{url}/health", timeout=ClientTimeout(total=self.gcfg.health_timeout_s)) as r:
                return r.status == 200, f"/health answered {r.status}"
        except Exception as err:  # noqa: BLE001 - refused, reset, timeout: the replica is not serving
            return False, f"/health: {type(err).__name__}: {err}"

    async def _sweep_loop(self) -> None:
        """Every sweep_interval_s: unload what no gateway uses any more (``Deployer.sweep``)."""
        while True:
            await asyncio.sleep(float(self.gcfg.sweep_interval_s or 0))
            try:
                record = await asyncio.to_thread(self.deployer.sweep, f"{self.who} sweep")
            except Exception:  # noqa: BLE001 - a replica or the home unreachable: retry next tick
                self.counts["sweep_errors"] += 1
                continue
            if record is not None:
                self.counts["swept"] += len(record["unloaded"])

    async def _probe_loop(self) -> None:
        """Every health_interval_s: probe each replica; one failing health_failures probes in a row
        goes out; one out that answers gets the routed adapters (in a worker thread, under the
        deployer's lock) and goes back in."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.gcfg.health_interval_s)
            urls = self.upstreams.urls
            for url, (ok, why) in zip(urls, await asyncio.gather(*(self._probe(u) for u in urls))):
                todo = self.upstreams.probed(url, ok, why, self.gcfg.health_failures)
                if todo == "out":
                    self.upstreams.mark_down(url, why)
                elif todo == "back":
                    try:
                        await loop.run_in_executor(None, self.deployer.restore_replica, url)
                    except Exception:  # noqa: BLE001 - logged in swaps.jsonl; it stays out, the next probe retries
                        pass

    # -- auth, bodies, trace and turn ids -----------------------------------------------------

    def _key(self, request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        return auth[7:].strip() if auth.startswith("Bearer ") else ""

    def _tenant(self, request: web.Request) -> str:
        tenant = self.keys.tenant_of(self._key(request))
        if tenant is None:
            raise ApiError(401, "Incorrect API key provided: a tenant's key is required (Authorization: Bearer <key>)",
                           code=E.INVALID_API_KEY)
        return tenant

    @staticmethod
    def _train(request: web.Request, ext: schemas.TracerlExtension) -> bool:
        """Whether the turn may be trained on: ``X-Tracerl-Train`` and ``tracerl.train``, true
        when neither is sent; a header other than true/false, or the two disagreeing, is a 400."""
        sent = request.headers.getall(TRAIN_HEADER, [])
        values = {v.strip().lower() for v in sent}
        if sent and (len(values) != 1 or not values <= {"true", "false"}):
            raise ApiError(400, f"header {TRAIN_HEADER} must be true or false (once), got "
                                f"{', '.join(repr(v[:40]) for v in sent[:3])}", TRAIN_HEADER, E.INVALID_VALUE,
                           reason="invalid_train_flag")
        header = values.pop() == "true" if sent else None
        if header is not None and ext.train is not None and header != ext.train:
            raise ApiError(400, f"tracerl.train={str(ext.train).lower()} contradicts header {TRAIN_HEADER}: "
                                f"{str(header).lower()}; send one of them", "tracerl.train", E.INVALID_VALUE,
                           reason="invalid_train_flag")
        return next((v for v in (header, ext.train) if v is not None), True)

    def _user(self, request: web.Request, tenant: str, body_user: str | None, trace_id: str | None,
              remember: bool = False) -> str | None:
        """The pseudonym of the request's end user: the body's ``user`` (already checked by its
        schema), else the ``X-Tracerl-User`` header (checked here: a 400 naming it), else the one
        this trace's turns had (None: no user). ``remember``: a chat turn's, kept per trace for the
        feedback and session end that name none."""
        raw = body_user
        if raw is None:
            sent = request.headers.getall(USER_HEADER, [])
            if len(sent) > 1:
                raise ApiError(400, f"header {USER_HEADER} is sent {len(sent)} times; send it once", USER_HEADER,
                               E.INVALID_VALUE, reason="invalid_user")
            if sent:
                raw = sent[0]
                try:
                    schemas.parse(schemas.UserHeader, {"user": raw})
                except ApiError as err:
                    raise ApiError(400, f"header {USER_HEADER}: {err.message.split(': ', 1)[-1]}", USER_HEADER,
                                   err.code, reason="invalid_user") from None
        if raw is None:
            return self._trace_users.get(trace_id) if trace_id else None
        user = self.privacy.pseudonym(tenant, raw)
        if remember and trace_id:
            self._trace_users[trace_id] = user
            self._trace_users.move_to_end(trace_id)
            while len(self._trace_users) > 100_000:
                self._trace_users.popitem(last=False)
        return user

    def _admin(self, request: web.Request) -> None:
        if not hmac.compare_digest(self._key(request).encode(), self._admin_key.encode()):
            raise ApiError(403, "the admin key is required", code=E.PERMISSION_DENIED)

    def _admin_or_own(self, request: web.Request, tenant: str | None = None) -> str:
        """The admin key, or ``tenant``'s own API key (a tenant answers its own users' requests, never
        another's: 403; None: any tenant's key, checked before the body is read); who is asking."""
        key = self._key(request)
        if hmac.compare_digest(key.encode(), self._admin_key.encode()):
            return "admin"
        own = self.keys.tenant_of(key)
        if own is None:
            raise ApiError(401, "the admin key or the tenant's API key is required", code=E.INVALID_API_KEY)
        if tenant is not None and own != tenant:
            raise ApiError(403, f"the key of tenant {own!r} cannot act for tenant {tenant!r}", "tenant",
                           E.PERMISSION_DENIED, reason="other_tenant")
        return f"tenant:{own}"

    async def _body(self, request: web.Request) -> Any:
        """The JSON body, size- and depth-guarded; every client mistake is an ApiError 4xx."""
        try:
            raw = await request.read()  # over client_max_size: 413 through the middleware
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, f"request body is over the {self.gcfg.max_body_bytes}-byte limit "
                                "(gateway.max_body_bytes)", code=E.REQUEST_TOO_LARGE) from None
        return parse_json(raw, self.gcfg.max_json_depth)

    def _sign(self, tenant: str, raw: str) -> str:
        return hmac.new(self._secret, f"{tenant}:{raw}".encode(), hashlib.sha256).hexdigest()[:16]

    def _sign_turn(self, tenant: str, trace_id: str, raw: str) -> str:
        return hmac.new(self._turn_secret, f"{tenant}:{trace_id}:{raw}".encode(), hashlib.sha256).hexdigest()[:16]

    def new_trace_id(self, tenant: str) -> str:
        raw = uuid.uuid4().hex
        return f"{raw}-{self._sign(tenant, raw)}"

    def new_turn_id(self, tenant: str, trace_id: str) -> str:
        """A turn id that proves which tenant's trace it belongs to, like trace ids do."""
        raw = uuid.uuid4().hex
        return f"{raw}-{self._sign_turn(tenant, trace_id, raw)}"

    def owns(self, tenant: str, trace_id: str) -> bool:
        raw, _, sig = str(trace_id).rpartition("-")
        return bool(raw) and hmac.compare_digest(sig.encode(), self._sign(tenant, raw).encode())

    def owns_turn(self, tenant: str, trace_id: str, turn_id: str) -> bool:
        raw, _, sig = str(turn_id).rpartition("-")
        return bool(raw) and hmac.compare_digest(sig.encode(), self._sign_turn(tenant, trace_id, raw).encode())

    def _turn_index(self, trace_id: str, given: int | None) -> int:
        index = given if given is not None else self._turns.get(trace_id, 0)
        self._turns[trace_id] = index + 1
        self._turns.move_to_end(trace_id)
        while len(self._turns) > 100_000:
            self._turns.popitem(last=False)
        return index

    def _redact(self, event: dict[str, Any]) -> dict[str, Any]:
        """PII out of what is recorded, where the tenant asks for it (``privacy.redact_pii``); the
        answer the client gets is built from the original, never from this."""
        if self.privacy.redacts(event["tenant"]) and self.privacy.apply(event):
            self.counts["redacted_events"] += 1
        return event

    def _check_event(self, event: dict[str, Any], reserve: int = 0, chat: bool = False) -> None:
        """What the emitter would refuse is refused now: the contract, and the size limit."""
        from pipelines.ingest.producer import encode

        try:
            _, value, _ = encode(event)
        except ValidationError as err:
            code = E.contract_code(err.reason)
            raise ApiError(413 if code == E.REQUEST_TOO_LARGE else 400,
                           f"the {event['type']} this request makes is invalid: {err}",
                           _contract_param(err, chat), code, reason=err.reason) from None
        if len(value) + reserve > self.max_event_bytes:
            room = f" plus {reserve} bytes kept for the output" if reserve else ""
            raise ApiError(413, f"the {event['type']} would be {len(value)} bytes{room}, over the "
                                f"{self.max_event_bytes}-byte event limit (ingest.max_event_bytes)",
                           "messages" if chat else None, E.REQUEST_TOO_LARGE, reason="event_too_large")

    def _output_room(self, req: ChatRequest) -> int:
        """Bytes kept free in the event for the output: per token asked for, at most half the limit."""
        return min(BYTES_PER_OUTPUT_TOKEN * (req.output_tokens() or DEFAULT_OUTPUT_TOKENS), self.max_event_bytes // 2)

    # -- chat ---------------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        tenant = self._tenant(request)
        req = parse(ChatRequest, await self._body(request))
        ext = req.tracerl or schemas.TracerlExtension()
        train = self._train(request, ext)
        given_trace = ext.trace_id or request.headers.get("X-Tracerl-Trace-Id")
        if given_trace and not self.owns(tenant, given_trace):
            raise ApiError(404, f"trace {given_trace[:80]!r} is not one of this tenant's traces", "tracerl.trace_id",
                           E.NOT_FOUND)
        trace_id = given_trace or self.new_trace_id(tenant)
        user = self._user(request, tenant, req.user, trace_id, remember=True)
        try:  # a canary's side sticks to the user when the app names one, else to the conversation
            lease = self.router.acquire(tenant, req.model, f"user:{user}" if user else f"trace:{trace_id}")
        except UnknownModel:
            raise ApiError(404, f"The model {req.model[:80]!r} does not exist for this API key", "model",
                           E.MODEL_NOT_FOUND) from None
        self.counts["requests"] += 1
        try:
            app = ext.app or self.gcfg.app
            await self._record_tool_results(tenant, trace_id if given_trace else None, lease.task, app, req, user)
            turn = {"trace_id": trace_id, "turn_id": self.new_turn_id(tenant, trace_id),
                    "adapter_version": int(lease.version), "turn_index": self._turn_index(trace_id, ext.turn_index),
                    "app": app, "train": train, "user": user}
            # n > 1: each choice is a turn of its own (its own id, for feedback), the same trace and
            # turn index: alternative samples of one prompt, which the learner groups (same input)
            turns = [turn, *(dict(turn, turn_id=self.new_turn_id(tenant, trace_id)) for _ in range((req.n or 1) - 1))]
            provisional = self._turn_event(lease, turn, req, text="", token_ids=[], logprobs=[], prompt_ids=None,
                                           finish=None, latency_ms=0.0)
            self._check_event(provisional, self._output_room(req), chat=True)  # the same for every choice
            want = {"logprobs": bool(req.logprobs), "token_ids": bool(req.return_token_ids)}
            upstream = dict(req.upstream(), model=lease.name, logprobs=True, return_token_ids=True)
            headers = {"X-Tracerl-Trace-Id": trace_id, "X-Tracerl-Turn-Id": turn["turn_id"]}
            if req.stream:
                return await self._stream(request, upstream, lease, turns, req, want, headers)
            return await self._unary(upstream, lease, turns, req, want, headers)
        finally:
            self.router.release(lease)

    async def _record_tool_results(self, tenant: str, trace_id: str | None, task: str, app: str,
                                   req: ChatRequest, user: str | None = None) -> None:
        """The ``tool`` messages answering this trace's calls, as the calling turns' tool_call events
        (before the model is asked, so a failed upstream call loses none). Without the trace id
        (a new trace) no call can be proved ours."""
        found, foreign = tool_results(req.messages, req.tool_dicts(),
                                      lambda turn_id: trace_id is not None and self.owns_turn(tenant, trace_id, turn_id))
        self.counts["tool_results_not_ours"] += foreign
        events = [ToolCall(tenant=tenant, app=app, trace_id=trace_id, task=task, turn_id=r.turn_id,
                           event_id=r.event_id, call_id=r.call_id, name=r.name, arguments=r.arguments,
                           outcome=r.outcome, error=r.error, user=user).to_dict() for r in found]
        for event in events:
            self._redact(event)
        for event in events:  # all checked before any is sent: a refused request records nothing
            self._check_event(event)
        await self._record(*events)
        self.counts["tool_results"] += len(events)

    async def _record(self, *events: dict[str, Any]) -> None:
        """Hand events to the emitter. Kafka up, that is all: it delivers them in the background.
        Kafka down (or not known up), it writes them to disk first (group commit, one fsync for
        every request waiting) and this waits for that, so no answer goes out over an event that
        only memory holds: a kill -9 of the gateway loses none of them (issue #40)."""
        waits = [asyncio.wrap_future(f) for f in map(self.emitter.emit, events) if f is not None]
        if not waits:
            return
        try:
            await asyncio.gather(*waits)
        except Exception as err:  # noqa: BLE001 - the spill write failed (disk full, ...)
            self.counts["record_errors"] += 1
            raise ApiError(503, f"the event could not be recorded (Kafka is down and the spill failed: {err})",
                           code=E.SERVICE_UNAVAILABLE) from None

    def _failed(self, lease) -> None:
        """vLLM answered this request with an error, or not at all (counted per route for swaps)."""
        self.counts["upstream_errors"] += 1
        lease.failed = True

    async def _post(self, body: dict[str, Any], tried: list[str] | None = None):
        """POST the chat body to a replica serving; entered, so the status and headers are in. A
        replica that cannot be reached is taken out, one that drops the connection before answering
        (it died mid-request, or closed an idle connection as it was reused) is not; either way
        the next replica is tried, so neither fails the request while another serves. ``tried``:
        the replicas this request has tried already (appended to).
        Returns (the context to exit, the response); NoReplica when none is left to try."""
        assert self.session is not None
        tried = [] if tried is None else tried
        while True:
            url = self.upstreams.pick(tried)
            tried.append(url)
            ctx = self.session.post(url + "/v1/chat/completions", json=body)
            try:
                return ctx, await ctx.__aenter__()
            except ClientConnectorError as err:  # refused, unreachable: it is not serving
                self.upstreams.mark_down(url, f"{type(err).__name__}: {err}")
            except ServerTimeoutError:  # slow, not gone: the client's 502, as before
                raise
            except ClientConnectionError:  # dropped or reset before any answer
                pass
            self.counts["upstream_retries"] += 1

    async def _upstream_error(self, lease, status: int, data: Any, headers) -> web.Response:
        """vLLM's 4xx goes to the client with its status, message and param, in this gateway's
        vocabulary (vLLM says ``type: BadRequestError, code: 400``; a prompt over the context is
        ``context_length_exceeded`` naming ``messages``); its 5xx is the gateway's 502."""
        self._failed(lease)
        err = data["error"] if isinstance(data, dict) and isinstance(data.get("error"), dict) else {}
        message = str(err.get("message") or data)[:2000] if err else str(data)[:500]
        if status < 500 and err:
            code = E.upstream_code(status, message)
            param = "messages" if code == E.CONTEXT_LENGTH_EXCEEDED else err.get("param")
            return error_response(status, message, param if isinstance(param, str) else None, code, headers=headers)
        return error_response(502 if status >= 500 else status, f"upstream vLLM answered {status}: {message}",
                              headers=headers)

    async def _unary(self, body, lease, turns, req, want, headers) -> web.Response:
        t0 = time.perf_counter()
        try:
            data, status = await self._unary_answer(body)
        except Exception as err:  # noqa: BLE001 - refused, reset, timeout: the client gets a 502
            self._failed(lease)
            if isinstance(err, NoReplica):
                return error_response(503, str(err), code=E.SERVICE_UNAVAILABLE)
            return error_response(502, f"upstream vLLM failed: {type(err).__name__}: {err}", code=E.UPSTREAM_ERROR)
        if status != 200:
            return await self._upstream_error(lease, status, data, headers)
        latency_ms = (time.perf_counter() - t0) * 1000
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index") or 0)
        if len(choices) != len(turns):
            self._failed(lease)
            return error_response(502, f"upstream vLLM answered {len(choices)} choices for n={len(turns)}",
                                  code=E.UPSTREAM_ERROR, headers=headers)
        events = []
        for choice, turn in zip(choices, turns):
            lps = [t["logprob"] for t in (choice.get("logprobs") or {}).get("content") or []]
            events.append(self._turn_record(lease, turn, req, text=choice["message"].get("content") or "",
                                            token_ids=list(choice.get("token_ids") or []), logprobs=lps,
                                            prompt_ids=data.get("prompt_token_ids"),
                                            finish=choice.get("finish_reason"), latency_ms=latency_ms))
        await self._record(*events)
        data["model"] = req.model
        for choice, turn in zip(choices, turns):
            said = req.prefix() + (choice["message"].get("content") or "")  # the model's whole reply
            reply = tool_reply(said, turn["turn_id"]) if req.tools_active() else None
            if req.prefix():
                choice["message"]["content"] = said
            if reply is not None:
                choice["message"].update(reply)
                choice["finish_reason"] = "tool_calls"
        data["choices"] = choices
        self._strip(data, want)
        for choice, turn in zip(data["choices"], turns):
            choice["turn_id"] = turn["turn_id"]
        data["tracerl"] = self._echo(turns)
        return web.json_response(data, headers=headers)

    @staticmethod
    def _echo(turns: list[dict[str, Any]]) -> dict[str, Any]:
        """The response's ``tracerl`` block: choice 0's turn as ``turn_id``, every choice's in ``turn_ids``."""
        return {**{k: turns[0][k] for k in ECHOED}, "turn_ids": [t["turn_id"] for t in turns]}

    async def _unary_answer(self, body: dict[str, Any]) -> tuple[Any, int]:
        """A whole (non-streamed) answer and its status. A replica that dies after its headers,
        mid-body, is like one that dies before them: nothing has reached the client yet, so the
        next replica is tried (seen once in CI: a replica SIGKILLed with 0 of 1297 bytes sent)."""
        tried: list[str] = []
        while True:
            ctx, resp = await self._post(body, tried)
            try:
                return await resp.json(content_type=None), resp.status
            except ServerTimeoutError:  # slow, not gone: the client's 502, as before
                raise
            except (ClientPayloadError, ClientConnectionError):
                self.counts["upstream_retries"] += 1
            finally:
                await ctx.__aexit__(None, None, None)

    @staticmethod
    def _strip(chunk: dict[str, Any], want: dict[str, bool]) -> None:
        """OpenAI's fields only, plus the token ids when the client asked (vLLM's `return_token_ids`):
        vLLM's internals (`prompt_logprobs`, `kv_transfer_params`, `stop_reason`, ...) stay here."""
        keep, keep_choice = OPENAI_FIELDS, OPENAI_CHOICE_FIELDS
        if want["token_ids"]:
            keep, keep_choice = keep | {"prompt_token_ids"}, keep_choice | {"token_ids"}
        for k in [k for k in chunk if k not in keep]:
            del chunk[k]
        for c in chunk.get("choices") or []:
            for k in [k for k in c if k not in keep_choice]:
                del c[k]
            if not want["logprobs"] and "logprobs" in c:
                c["logprobs"] = None

    async def _stream(self, request, body, lease, turns, req, want, headers) -> web.StreamResponse:
        """vLLM's chunks passed on as they come (choice ``i`` of ``n`` in chunks with ``index: i``),
        each choice's own text, tokens and logprobs gathered for its turn; every turn is recorded
        before ``[DONE]``. ``tracerl`` rides on the first chunk, a choice's ``turn_id`` on its first."""
        t0 = time.perf_counter()
        n = len(turns)
        text: list[list[str]] = [[] for _ in range(n)]
        ids: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        lp_entries: list[list[dict]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        prompt_ids, named = None, set()
        hold, template = req.tools_active(), None  # tools: answer once the reply is whole
        try:
            ctx, up = await self._post(body)
        except Exception as err:  # noqa: BLE001
            self._failed(lease)
            if isinstance(err, NoReplica):
                return error_response(503, str(err), code=E.SERVICE_UNAVAILABLE)
            return error_response(502, f"upstream vLLM failed: {type(err).__name__}: {err}", code=E.UPSTREAM_ERROR)
        try:
            if up.status != 200:
                try:
                    data = await up.json(content_type=None)
                except ValueError:
                    data = await up.text()
                return await self._upstream_error(lease, up.status, data, headers)
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
                    i = c.get("index") or 0
                    if not 0 <= i < n:
                        raise ValueError(f"upstream vLLM streamed choice {i} for n={n}")
                    text[i].append((c.get("delta") or {}).get("content") or "")
                    ids[i].extend(c.get("token_ids") or [])
                    entries = (c.get("logprobs") or {}).get("content") or []
                    lps[i].extend(t["logprob"] for t in entries)
                    lp_entries[i].extend(entries)
                    finish[i] = c.get("finish_reason") or finish[i]
                if hold:
                    template = template or chunk
                    continue
                chunk["model"] = req.model
                self._strip(chunk, want)
                for c in chunk.get("choices") or []:
                    i = c.get("index") or 0
                    if i not in named:
                        named.add(i)
                        c["turn_id"] = turns[i]["turn_id"]
                if first:
                    chunk["tracerl"] = self._echo(turns)
                    first = False
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if hold:
                for chunk in self._held_chunks(template or {}, [req.prefix() + "".join(t) for t in text], finish,
                                               lp_entries, ids, prompt_ids, turns, req, want):
                    await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            latency_ms = (time.perf_counter() - t0) * 1000
            events = [self._turn_record(lease, turn, req, text="".join(text[i]), token_ids=ids[i], logprobs=lps[i],
                                        prompt_ids=prompt_ids, finish=finish[i], latency_ms=latency_ms)
                      for i, turn in enumerate(turns)]
            try:  # recorded before [DONE]: with Kafka down, on disk before the answer is complete
                await self._record(*events)
            except ApiError:  # not recorded: no [DONE], the client sees a broken stream, not an answer
                resp.force_close()
                return resp
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
        return resp

    @classmethod
    def _held_chunks(cls, template, texts, finish, lp_entries, ids, prompt_ids, turns, req, want) -> list[dict]:
        """A held (tools) reply as OpenAI stream chunks, choice by choice: the content, then the
        calls whole, then the finish reason; logprobs and token ids ride on each choice's first
        chunk when asked for, ``tracerl`` (and the prompt's token ids) on the very first."""
        base = {k: template[k] for k in ("id", "object", "created") if k in template}
        base["model"] = req.model
        chunks: list[dict[str, Any]] = []
        for i, (text, turn) in enumerate(zip(texts, turns)):
            reply = tool_reply(text, turn["turn_id"])
            first: dict[str, Any] = {"index": i, "delta": {"role": "assistant", "content": text if reply is None
                                                          else reply["content"]}, "finish_reason": None,
                                     "turn_id": turn["turn_id"]}
            if want["logprobs"]:
                first["logprobs"] = {"content": lp_entries[i]}
            if want["token_ids"]:
                first["token_ids"] = ids[i]
            chunks.append(dict(base, choices=[first]))
            if reply is not None:
                calls = [dict(c, index=j) for j, c in enumerate(reply["tool_calls"])]
                chunks.append(dict(base, choices=[{"index": i, "delta": {"tool_calls": calls}, "finish_reason": None}]))
            chunks.append(dict(base, choices=[{"index": i, "delta": {},
                                               "finish_reason": "tool_calls" if reply is not None else finish[i]}]))
        chunks[0]["tracerl"] = cls._echo(turns)
        if want["token_ids"] and prompt_ids is not None:
            chunks[0]["prompt_token_ids"] = prompt_ids
        return chunks

    def _turn_event(self, lease, turn, req: ChatRequest, *, text, token_ids, logprobs, prompt_ids, finish,
                    latency_ms) -> dict[str, Any]:
        messages = [Message(**m) for m in req.served_messages()]
        sampling = Sampling(temperature=1.0 if req.temperature is None else req.temperature,
                            top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k,
                            max_tokens=req.output_tokens(), seed=req.seed)
        return ModelTurn(tenant=lease.tenant, app=turn["app"], trace_id=turn["trace_id"], task=lease.task,
                         turn_id=turn["turn_id"], turn_index=turn["turn_index"], model=lease.name,
                         adapter_version=turn["adapter_version"], input_messages=messages, output_text=text,
                         output_token_ids=token_ids, output_logprobs=logprobs, prompt_token_ids=prompt_ids,
                         sampling=sampling, finish_reason=finish, latency_ms=round(latency_ms, 2),
                         train=turn["train"], arm=lease.arm, user=turn["user"]).to_dict()

    def _turn_record(self, lease, turn, req, **outputs) -> dict[str, Any]:
        """The served turn's event, for ``_record``. Prompt ids are optional in the contract (the
        learner can re-tokenize): they are the first thing left out of an event that would be oversize."""
        event = self._redact(self._turn_event(lease, turn, req, **outputs))
        if event.get("prompt_token_ids") and len(wire_json(event)) > self.max_event_bytes:
            event.pop("prompt_token_ids")
            self.counts["prompt_ids_dropped"] += 1
        return event

    # -- feedback, models, health -------------------------------------------------------------

    async def feedback(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        body = await self._body(request)
        if not isinstance(body, dict):
            raise ApiError(400, f"Invalid type for the body: expected an object, but got {E.json_kind(body)} instead.",
                           code=E.INVALID_TYPE)
        kind = body.setdefault("type", "feedback")
        model = schemas.FEEDBACK_BODIES.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise ApiError(400, f"Invalid 'type': must be one of {sorted(schemas.FEEDBACK_BODIES)}, got "
                                f"{str(kind)[:40]!r}", "type", E.INVALID_VALUE)
        fields = parse(model, body).model_dump(exclude_none=True, exclude={"type"})
        if fields.pop("tenant", tenant) != tenant:
            raise ApiError(403, "tenant in the body is not this key's tenant (the key decides it)", "tenant",
                           E.PERMISSION_DENIED)
        trace_id = fields["trace_id"]
        if not self.owns(tenant, trace_id):
            raise ApiError(404, f"trace {trace_id[:80]!r} is not one of this tenant's traces", "trace_id", E.NOT_FOUND)
        if "turn_id" in fields and not self.owns_turn(tenant, trace_id, fields["turn_id"]):
            raise ApiError(404, f"turn {fields['turn_id'][:80]!r} is not a turn of trace {trace_id[:80]!r}", "turn_id",
                           E.NOT_FOUND)
        fields.setdefault("app", self.gcfg.app)
        fields["user"] = self._user(request, tenant, fields.pop("user", None), trace_id)
        event = self._redact(EVENT_TYPES[kind](tenant=tenant, **fields).to_dict())
        self._check_event(event)
        await self._record(event)
        return web.json_response({"event_id": event["event_id"], "trace_id": event["trace_id"]}, status=202)

    async def health(self, _request: web.Request) -> web.Response:
        """503 once the emitter is dead (turns would be served but not recorded) or no vLLM replica
        serves (a load balancer in front of several gateways then sends requests to the others).
        Replica addresses are in /admin/stats only. ``lake`` is the lake's lag behind Kafka
        (``ok`` false past ingest.lag_alarm_*): reported, never a 503, since serving is fine and a
        load balancer must not take every gateway out because ingest fell behind."""
        emitter = self.emitter.health()
        serving = len(self.upstreams.serving())
        ok = emitter.get("state") != "dead" and serving > 0
        return web.json_response({"ok": ok, "emitter": emitter,
                                  "replicas": {"serving": serving, "of": len(self.upstreams.urls)},
                                  "lake": self.lake_lag.latest() if self.lake_lag is not None else None},
                                 status=200 if ok else 503)

    async def openapi(self, _request: web.Request) -> web.Response:
        return web.json_response(self._openapi)

    def _public_models(self, tenant: str) -> list[dict[str, Any]]:
        """The router's model objects with ``version`` the adapter version as an int (4, as every
        turn's ``adapter_version`` says it), not the store's folder label (``v4``)."""
        versions = {r.task: int(r.version) for r in self.router.routes() if r.tenant == tenant}
        return [dict(m, version=versions.get(m["id"], parse_version(m.get("version")))) for m in
                self.router.public_models(tenant)]

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": self._public_models(self._tenant(request))})

    async def model(self, request: web.Request) -> web.Response:
        """``models.retrieve(name)``: ``task`` or ``tenant/task`` of the caller's own tenant."""
        tenant = self._tenant(request)
        name = request.match_info["model"]
        try:
            _, task = self.router.resolve(tenant, name)
        except UnknownModel:
            task = None
        found = [m for m in self._public_models(tenant) if m["id"] == task]
        if not found:
            raise ApiError(404, f"The model {name[:80]!r} does not exist for this API key", "model", E.MODEL_NOT_FOUND)
        return web.json_response(found[0])

    # -- admin --------------------------------------------------------------------------------

    async def _operator(self, request: web.Request, action: str) -> web.Response:
        """``tracerl deploy | rollback`` over HTTP: move ``champion`` with who and why, then
        reconcile this gateway in a worker thread (the swap drains requests this loop serves)."""
        from pipelines.adapters.promote import RegistryError

        self._admin(request)
        if action == "deploy":
            d = parse(schemas.DeployRequest, await self._body(request))
            run, tenant, task = (lambda: operations.deploy(self.cfg, d.tenant, d.task, d.version, d.who or "admin",
                                                           d.why, force=d.force, gateway=self.handle()),
                                 d.tenant, d.task)
        else:
            r = parse(schemas.RollbackRequest, await self._body(request))
            run, tenant, task = (lambda: operations.rollback(self.cfg, r.tenant, r.task, r.who or "admin", r.why,
                                                             gateway=self.handle()), r.tenant, r.task)
        try:
            result = await asyncio.to_thread(run)
        except operations.Refused as err:
            raise ApiError(409, f"refused: {err}", "force", E.CONFLICT, reason="refused") from None
        except operations.NotRegistered as err:
            raise ApiError(404, str(err), "version", E.NOT_FOUND, reason="not_registered") from None
        except RegistryError as err:
            raise ApiError(409, str(err), code=E.CONFLICT, reason=f"{action}_refused") from None
        if not result.ok:
            raise ApiError(409, f"{action} {tenant}/{task}: the registry moved ({result.registry.get('reason')}), "
                                f"but {result.summary()}; the next `deployment` run retries",
                           code=E.CONFLICT, reason="swap_failed")
        return web.json_response(result.to_dict(), dumps=lambda o: json.dumps(o, default=str))

    async def admin_deploy(self, request: web.Request) -> web.Response:
        return await self._operator(request, "deploy")

    async def admin_rollback(self, request: web.Request) -> web.Response:
        return await self._operator(request, "rollback")

    async def internal_swap(self, request: web.Request) -> web.Response:
        """The reconciler's swap primitive (``service.swap``): load, flip, drain, unload."""
        self._admin(request)
        req = parse(schemas.SwapRequest, await self._body(request))
        try:
            record = await asyncio.to_thread(self.deployer.promote, req.tenant, req.task, req.version,
                                             req.who or "reconcile")
        except DeployError as err:
            raise ApiError(409, str(err), code=E.CONFLICT, reason="swap_refused") from None
        return web.json_response(record)

    async def _canary(self, request: web.Request, model: type, run) -> web.Response:
        """One canary action in a worker thread (a stop drains the challenger's requests)."""
        self._admin(request)
        body = parse(model, await self._body(request))
        try:
            record = await asyncio.to_thread(run, body)
        except DeployError as err:
            raise ApiError(409, str(err), code=E.CONFLICT, reason="canary_refused") from None
        return web.json_response(record)

    async def admin_canary_start(self, request: web.Request) -> web.Response:
        def run(b: schemas.CanaryRequest) -> dict[str, Any]:
            share = b.share if b.share is not None else self.cfg.for_target(b.tenant, b.task).canary.share
            record = self.deployer.start_canary(b.tenant, b.task, b.version, share, b.who or "admin", b.why,
                                                b.canary_id)
            return {**record, "registry": operations.record_canary(self.cfg, b.tenant, b.task, b.version, True,
                                                                   b.who or "admin", b.why, record["canary_id"], share)}
        return await self._canary(request, schemas.CanaryRequest, run)

    async def admin_canary_share(self, request: web.Request) -> web.Response:
        def run(b: schemas.CanaryShareRequest) -> dict[str, Any]:
            record = self.deployer.set_share(b.tenant, b.task, b.share, b.who or "admin", b.why or "")
            live = self.router.live(b.tenant, b.task)
            version = live.canary.version if live is not None and live.canary is not None else None
            return record if version is None else {**record, "registry": operations.record_canary_share(
                self.cfg, b.tenant, b.task, version, b.share, b.who or "admin", b.why or "")}
        return await self._canary(request, schemas.CanaryShareRequest, run)

    async def admin_canary_stop(self, request: web.Request) -> web.Response:
        def run(b: schemas.CanaryStopRequest) -> dict[str, Any]:
            live = self.router.live(b.tenant, b.task)
            record = self.deployer.stop_canary(b.tenant, b.task, b.who or "admin", b.why)
            stopped = live.canary.version if live is not None and live.canary is not None else None
            if stopped is not None:
                record["registry"] = operations.record_canary(self.cfg, b.tenant, b.task, stopped, False, b.who or "admin", b.why)
            return record
        return await self._canary(request, schemas.CanaryStopRequest, run)

    async def admin_forget(self, request: web.Request) -> web.Response:
        """``tracerl forget`` filed over HTTP (issue #42): the request is recorded at once (a durable
        file, the pseudonym only) and `forget_job` (its hourly schedule, or ``tracerl forget``) carries it
        out; 202 with the request's id and status. Asking again for an open request returns it."""
        from pipelines.privacy import forget_requests

        self._admin_or_own(request)
        body = parse(schemas.ForgetRequest, await self._body(request))
        who = body.who or self._admin_or_own(request, body.tenant)
        self._known_tenant(body.tenant)
        filed = await asyncio.to_thread(forget_requests.file_request, self.cfg, body.tenant, body.user, who)
        return web.json_response({k: filed[k] for k in ("id", "tenant", "user", "status", "requested_at")},
                                 status=202)

    async def admin_consent(self, request: web.Request) -> web.Response:
        """A user's training consent (issue #42, pipelines/lake/consent.py): from now on their turns are
        trained on (``consent: true``) or not; the record holds the pseudonym, never the app's id."""
        from pipelines.lake.consent import ConsentError, record_consent

        self._admin_or_own(request)
        body = parse(schemas.ConsentRequest, await self._body(request))
        who = body.who or self._admin_or_own(request, body.tenant)
        self._known_tenant(body.tenant)
        user = self.privacy.pseudonym(body.tenant, body.user)
        try:
            rec = await asyncio.to_thread(record_consent, self.cfg, body.tenant, user, body.consent, who, body.reason)
        except ConsentError as err:
            raise ApiError(400, str(err), code=E.INVALID_VALUE, reason="invalid_consent") from None
        return web.json_response(rec.to_dict(), dumps=lambda o: json.dumps(o, default=str))

    def _known_tenant(self, tenant: str) -> None:
        """404 for a tenant this deployment does not serve (no key, route or settings of it)."""
        served = {r.tenant for r in self.router.routes()} | set(self.keys.tenants()) | set(self.cfg.targets)
        if tenant not in served:
            raise ApiError(404, f"no tenant {tenant!r} is served here", "tenant", E.NOT_FOUND, reason="unknown_tenant")

    async def admin_canaries(self, request: web.Request) -> web.Response:
        self._admin(request)
        return web.json_response({"canaries": self.canaries()})

    def canaries(self) -> list[dict[str, Any]]:
        """Every route's running canary: who started it and why, its share, requests in flight per side."""
        out = []
        for r in self.router.routes():
            if r.canary is None:
                continue
            c = r.canary
            out.append({"tenant": r.tenant, "task": r.task, "champion": r.version, "challenger": c.version,
                        "share": c.share, "id": c.id, "started_at": c.started_at, "who": c.who, "why": c.why,
                        "inflight": {"champion": self.router.inflight(r.name),
                                     "challenger": self.router.inflight(r.canary_name)}})
        return out

    async def admin_swaps(self, request: web.Request) -> web.Response:
        self._admin(request)
        query = parse(schemas.SwapsQuery, dict(request.query))
        return web.json_response(read_swaps(self.deployer.swaps_path, query.limit))

    async def admin_stats(self, request: web.Request) -> web.Response:
        self._admin(request)
        routes = [{"tenant": r.tenant, "task": r.task, "version": r.version, "inflight": self.router.inflight(r.name),
                   **dict(zip(("requests", "failed_requests"), self.router.ended(r.tenant, r.task))),
                   "canary": None if r.canary is None else {"version": r.canary.version, "share": r.canary.share}}
                  for r in self.router.routes()]
        return web.json_response({"gateway": self.counts, "emitter": self.emitter.stats(), "routes": routes,
                                  "replicas": self.upstreams.stats(), "last_reconcile": self.last_reconcile})
