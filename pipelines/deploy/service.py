"""Run the gateway: in this process (``serve``), in a thread (tests, benches) or as a background
process with a pid/port state file (``start_gateway`` / ``stop_gateway``, like the Kafka broker);
the swap primitive (``swap``; what should serve is decided by ``reconcile``), ``swap_history``
and a small app SDK.

State under ``<home>``: ``run/gateway.json`` (pid, port), ``logs/gateway.log``,
``gateway/admin.key`` and ``gateway/secret`` (0600, generated once), ``gateway/keys/<tenant>.key``
(tenant keys, followed by the running gateway: ``keys.py``), ``deploy/routes.json``,
``deploy/swaps.jsonl``, ``spill/``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.config import TracerlConfig
from pipelines.services import process
from pipelines.services.process import ProcessState
from pipelines.config.gateway import GatewayConfig

if TYPE_CHECKING:  # the gateway (aiohttp) loads only where one is built: `tracerl status` stays fast
    from pipelines.deploy.gateway import Gateway


class GatewayError(RuntimeError):
    pass


def gateway_config(cfg: TracerlConfig) -> GatewayConfig:
    return getattr(cfg, "gateway", None) or GatewayConfig()


def _secret_file(path: Path, nbytes: int = 32) -> str:
    """Read ``path``, or create it, whole, with a random token readable by its owner only."""
    from pipelines.deploy.keys import write_key_file

    return write_key_file(path, nbytes)[0]


def admin_key(cfg: TracerlConfig) -> str:
    return gateway_config(cfg).admin_key or os.environ.get("TRACERL_GATEWAY_ADMIN_KEY") or \
        _secret_file(Path(cfg.home) / "gateway" / "admin.key")


def tenant_key(cfg: TracerlConfig, tenant: str) -> str:
    """The tenant's API key: `gateway.api_keys[tenant]`, else `<home>/gateway/keys/<tenant>.key`
    (created on first use; a running gateway picks it up on its next request)."""
    from pipelines.deploy.keys import KEY_BYTES, key_path

    configured = gateway_config(cfg).api_keys.get(tenant)
    return configured or _secret_file(key_path(cfg.home, tenant), KEY_BYTES)


def gateway_dirs(cfg: TracerlConfig, gcfg: GatewayConfig) -> tuple[Path, Path]:
    """(deploy dir: routes.json and swaps.jsonl, spill dir) of this gateway: ``<home>/deploy`` and
    ``<home>/spill`` for the single gateway, ``<home>/gateways/<instance>/...`` for one of several
    (each serves from its own router, reconciled to the same registry)."""
    home = Path(cfg.home)
    if not gcfg.instance:
        return cfg.routes_path.parent, home / "spill"
    own = home / "gateways" / gcfg.instance
    return own / "deploy", own / "spill"


def key_ring(cfg: TracerlConfig, gcfg: GatewayConfig, admin: str):
    """The gateway's keys: configured ones plus `<home>/gateway/keys/*.key`, followed while it runs."""
    from pipelines.deploy.keys import KeyRing, key_folder

    return KeyRing(gcfg.api_keys, key_folder(cfg.home), reserved=(admin,))


def build_gateway(cfg: TracerlConfig, gcfg: GatewayConfig | None = None, **emitter_options: Any) -> "Gateway":
    """Wire router, deployer and emitter from the configuration; load the routed versions."""
    from pipelines.deploy import admin
    from pipelines.deploy.deployer import Deployer
    from pipelines.deploy.emitter import Emitter, EmitterConfig
    from pipelines.deploy.gateway import Gateway
    from pipelines.deploy.routing import Router
    from pipelines.deploy.upstreams import Upstreams
    from pipelines.deploy.vllm_server import read_state
    from pipelines.models.registry import base_model_hash
    from pipelines.adapters.store import AdapterStore

    gcfg = gcfg or gateway_config(cfg)
    home = Path(cfg.home)
    upstreams = list(gcfg.upstreams)
    if not upstreams:
        state = read_state(home)
        if state is None:
            raise GatewayError("no vLLM to serve: start it (tracerl start vllm) or set gateway.upstreams")
        upstreams = [state.base_url]
    roots, down = set(), {}
    for url in upstreams:  # a replica down now starts out of the round-robin; it joins when it answers
        try:
            roots |= {m["root"] for m in admin.list_models(url) if m.get("parent") is None}
        except admin.VllmAdminError as err:
            if err.status is not None:
                raise GatewayError(f"vLLM at {url}: {err}") from None
            down[url] = str(err)
    if len(down) == len(upstreams):
        raise GatewayError(f"no vLLM replica answers: {'; '.join(down.values())}")
    if len(roots) != 1:
        raise GatewayError(f"upstreams {upstreams} serve different base models {sorted(roots)}; use one base")
    root = roots.pop()
    base_hash = base_model_hash(Path(root))
    deploy_dir, spill_dir = gateway_dirs(cfg, gcfg)
    router = Router(deploy_dir / "routes.json")
    deployer = Deployer(router, Upstreams(upstreams, down), AdapterStore(cfg.adapter_root), base_hash,
                        deploy_dir / "swaps.jsonl", gcfg.drain_timeout_s, base_root=root, home=home)
    deployer.restore()
    emitter = Emitter(cfg, spill_dir, EmitterConfig(queue_size=gcfg.queue_size,
                                                          replay_interval_s=gcfg.replay_interval_s),
                      **emitter_options)
    secret = _secret_file(home / "gateway" / "secret").encode()
    admin = gcfg.admin_key or admin_key(cfg)
    return Gateway(gcfg, router, deployer, emitter, secret, admin, key_ring(cfg, gcfg, admin))


class GatewayThread:
    """The gateway on its own event loop in a thread of this process (tests and benches)."""

    def __init__(self, gateway: "Gateway", host: str = "127.0.0.1", port: int = 0):
        from aiohttp import web

        self.gateway, self.host = gateway, host
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(gateway.app(), access_log=None)
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, host, port, backlog=1024)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="tracerl-gateway", daemon=True)
        self.thread.start()
        if not ready.wait(30):
            raise GatewayError("gateway thread did not start within 30 s")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.gateway.emitter.close()


def serve(cfg: TracerlConfig, gcfg: GatewayConfig | None = None, backlog: int = 128) -> None:
    """Run the gateway in the foreground until SIGTERM/SIGINT (what ``start_gateway`` spawns)."""
    from aiohttp import web

    gcfg = gcfg or gateway_config(cfg)
    gateway = build_gateway(cfg, gcfg)
    print(f"tracerl gateway on http://{gcfg.host}:{gcfg.port} -> {gateway.upstreams.urls}", flush=True)
    try:
        web.run_app(gateway.app(), host=gcfg.host, port=gcfg.port or 0, access_log=None, print=None,
                    backlog=backlog)
    finally:
        gateway.emitter.close()


# -- the gateway as a background process (pipelines/services/process.py keeps its PID) -----------

NAME = "gateway"


def read_gateway_state(cfg: TracerlConfig) -> ProcessState | None:
    return process.read_state(Path(cfg.home) / "run", NAME)


def start_gateway(cfg: TracerlConfig, config_path: str | None = None, timeout: float = 60.0) -> ProcessState:
    """Spawn ``python -m pipelines.deploy.service`` (reads the same config), wait for /health."""
    state = read_gateway_state(cfg)
    if state is not None:
        return state
    gcfg = gateway_config(cfg)
    port = gcfg.port or process.free_port()
    env = dict(os.environ, TRACERL_HOME=str(Path(cfg.home).resolve()), TRACERL_GATEWAY_PORT=str(port))
    if config_path:
        env["TRACERL_CONFIG"] = str(config_path)
    run_dir = Path(cfg.home) / "run"
    state = process.spawn(NAME, [sys.executable, "-m", "pipelines.deploy.service"], run_dir=run_dir,
                          log=Path(cfg.home) / "logs" / "gateway.log", port=port, url=f"http://{gcfg.host}:{port}",
                          env=env, cwd=Path(__file__).resolve().parents[2])
    try:
        process.wait_http(state, "/health", timeout, run_dir)
    except process.ServiceError as err:
        raise GatewayError(str(err)) from None
    return state


def stop_gateway(cfg: TracerlConfig, timeout: float = 15.0) -> bool:
    return process.stop(Path(cfg.home) / "run", NAME, timeout)


# -- admin calls for the CLI, and the app SDK ----------------------------------------------------

def _call(url: str, key: str, body: dict | None = None, method: str = "POST", timeout: float = 300.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {key}", **({"Content-Type": "application/json"} if data else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            text = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
        raise GatewayError(f"HTTP {e.code}: {text}") from None


def _gateway_url(cfg: TracerlConfig) -> str:
    state = read_gateway_state(cfg)
    if state is None:
        raise GatewayError("the gateway is not running: start it with `tracerl start gateway`")
    return state.url


def swap(cfg: TracerlConfig, tenant: str, task: str, version: int, who: str) -> dict[str, Any]:
    """Hot-swap adapter ``version`` into the running gateway (load, flip, drain, unload) through
    its reconciler-only ``/internal/swap``: the one swap primitive, called by reconcile
    (pipelines/deploy/reconcile.py), which decides what should serve from the registry's
    ``champion``. Operators move the alias instead (``tracerl deploy``, ``/admin/deploy``). The swap
    record, or GatewayError (the old version keeps serving)."""
    return _call(f"{_gateway_url(cfg)}/internal/swap", admin_key(cfg),
                 {"tenant": tenant, "task": task, "version": int(version), "who": who})


def canary(cfg: TracerlConfig, action: str, tenant: str, task: str, **fields: Any) -> dict[str, Any]:
    """A canary action on the running gateway: ``start`` (version, share?, who, why), ``share``
    (share, who, why?) or ``stop`` (who, why); the swap record, or GatewayError (nothing changed)."""
    path = {"start": "/admin/canary", "share": "/admin/canary/share", "stop": "/admin/canary/stop"}[action]
    body = {"tenant": tenant, "task": task, **{k: v for k, v in fields.items() if v is not None}}
    return _call(f"{_gateway_url(cfg)}{path}", admin_key(cfg), body)


def canaries(cfg: TracerlConfig) -> list[dict[str, Any]]:
    """The running gateway's canaries (``GET /admin/canary``)."""
    return _call(f"{_gateway_url(cfg)}/admin/canary", admin_key(cfg), method="GET")["canaries"]


def swap_history(cfg: TracerlConfig, limit: int | None = None) -> list[dict[str, Any]]:
    """Every swap (who, when, from, to, ok) from ``<home>/deploy/swaps.jsonl``; no gateway needed."""
    from pipelines.deploy.deployer import read_swaps

    return read_swaps(Path(cfg.home) / "deploy" / "swaps.jsonl", limit)


class GatewayClient:
    """The app SDK: chat through the gateway, then report feedback and tool outcomes."""

    def __init__(self, url: str, api_key: str, timeout: float = 300.0):
        self.url, self.key, self.timeout = url.rstrip("/"), api_key, timeout

    def chat(self, model: str, messages: list[dict], *, tools: list[dict] | None = None,
             tool_choice: str | dict | None = None, **params: Any) -> dict[str, Any]:
        """One chat completion; ``tools`` (OpenAI function tools) and ``tool_choice`` ("auto",
        "none", "required" or a named function) are sent only when given, like every other OpenAI
        param in ``params``."""
        extra = {k: v for k, v in (("tools", tools), ("tool_choice", tool_choice)) if v is not None}
        return _call(f"{self.url}/v1/chat/completions", self.key,
                     {"model": model, "messages": messages, **extra, **params}, timeout=self.timeout)

    def feedback(self, trace_id: str, turn_id: str, kind: str, value: float | None = None, **fields: Any) -> dict:
        return _call(f"{self.url}/v1/feedback", self.key, {"type": "feedback", "trace_id": trace_id,
                                                           "turn_id": turn_id, "kind": kind, "value": value, **fields})

    def tool_call(self, trace_id: str, turn_id: str, name: str, outcome: str, **fields: Any) -> dict:
        return _call(f"{self.url}/v1/feedback", self.key, {"type": "tool_call", "trace_id": trace_id,
                                                           "turn_id": turn_id, "name": name, "outcome": outcome,
                                                           **fields})

    def end(self, trace_id: str, outcome: str = "completed", **fields: Any) -> dict:
        return _call(f"{self.url}/v1/feedback", self.key, {"type": "session_end", "trace_id": trace_id,
                                                           "outcome": outcome, **fields})


if __name__ == "__main__":
    from pipelines.config import load_config

    _cfg = load_config()
    if os.environ.get("TRACERL_GATEWAY_PORT"):
        _g = gateway_config(_cfg)
        if hasattr(_cfg, "gateway"):
            _cfg.gateway.port = int(os.environ["TRACERL_GATEWAY_PORT"])
        else:
            _g.port = int(os.environ["TRACERL_GATEWAY_PORT"])
            _cfg.gateway = _g  # type: ignore[attr-defined]
    serve(_cfg)
