"""End-to-end fixtures: a real Dagster webserver, a real MLflow server and headless Chromium.

Chromium is driven over the Chrome DevTools Protocol (CDP): it is started with
`--remote-debugging-port=0`, the test connects to the page's websocket with aiohttp,
navigates, and polls the rendered DOM in real time until the expected text shows up
(the UIs are single-page apps that render after their GraphQL/REST calls return).
Every page visited leaves a screenshot and its text in the module's tmp folder.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_NAMES = ("chromium", "chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--disable-dev-shm-usage", "--window-size=1600,1000"]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (each server runs in its own session), then SIGKILL."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def e2e_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def stack_cfg(e2e_dir):
    """A tracerl home for the services `tracerl up` starts (MLflow UI, Dagster)."""
    from pipelines.config import TracerlConfig

    return TracerlConfig(home=e2e_dir / "home")


@pytest.fixture(scope="module")
def dagster_ui(e2e_dir, stack_cfg):
    """`tracerl up`'s Dagster (webserver + daemon on `assets.definitions`) on a fresh DAGSTER_HOME."""
    from pipelines.reward.spec import fallback_spec_path
    from pipelines.services.dagster import start_dagster, stop_dagster

    home = e2e_dir / "dagster_home"
    home.mkdir()
    if (REPO / "dagster_home" / "dagster.yaml").exists():
        shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    before = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        yield start_dagster(stack_cfg, reward_spec=fallback_spec_path()).url
    finally:
        stop_dagster(stack_cfg)
        if before is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = before


@pytest.fixture(scope="module")
def mlflow_ui(stack_cfg):
    """`tracerl up`'s MLflow server, over a store where the library registered `acme.concise`
    version 1 (an adapter artifact on a run) and aliased it `champion`.

    Yields (base URL, model name, version).
    """
    import mlflow

    from pipelines.adapters import registry
    from pipelines import tracking
    from pipelines.services.mlflow_server import start_mlflow, stop_mlflow

    cfg = stack_cfg
    adapter = cfg.home / "adapter-src"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    with tracking.run(cfg, "e2e learner", tags={"tracerl.stage": "learner"}, params={}) as run:
        mlflow.log_artifacts(str(adapter), "adapter")
    version = registry.register_candidate(cfg, "acme", "concise", run.info.run_id, 1, {"tenant": "acme"})
    registry.set_alias(cfg, "acme", "concise", registry.CHAMPION, version)
    try:
        yield start_mlflow(cfg).url, registry.model_name("acme", "concise"), str(version)
    finally:
        stop_mlflow(cfg)


class Page:
    """One CDP page session (an aiohttp websocket); commands are awaited by id, events are ignored."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)

    async def send(self, method: str, **params):
        i = next(self.ids)
        await self.ws.send_json({"id": i, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=30)
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"CDP {method}: {msg['error']}")
                return msg.get("result", {})

    async def evaluate(self, expression: str):
        r = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page JS failed: {r['exceptionDetails']}")
        return r["result"].get("value")


class Chromium:
    """Headless Chromium started on first use; `visit` navigates and waits for a JS condition."""

    def __init__(self, out: Path):
        self.out = out
        self.proc: subprocess.Popen | None = None
        self.cdp: str | None = None

    def _start(self) -> None:
        exe = next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)
        if exe is None:
            pytest.fail("Chromium is not installed: the browser tests need it. "
                        "Run `apt-get install -y chromium` (Debian), as .ci/run does.", pytrace=False)
        profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=self.out))
        self.log = self.out / "chromium.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                          "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                                          "about:blank"],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        active = profile / "DevToolsActivePort"  # Chromium writes the port it picked here
        deadline = time.monotonic() + 30
        while not (active.exists() and active.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                stop(self.proc)
                raise RuntimeError(f"chromium did not start: {self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        self.cdp = f"http://127.0.0.1:{active.read_text().split()[0]}"

    def visit(self, url: str, probe_js: str, done, shot: str, timeout: float = 60) -> dict:
        """Open `url` in a new tab; evaluate `probe_js` every 0.5 s until `done(value)` or `timeout`.

        Returns {"ok": bool, "value": the last probe value, "text": document.body.innerText,
        "screenshot": path}; the screenshot and text are also saved as `<shot>.png` / `<shot>.txt`.
        """
        if self.proc is None:
            self._start()
        return asyncio.run(self._visit(url, probe_js, done, shot, timeout))

    async def _visit(self, url: str, probe_js: str, done, shot: str, timeout: float) -> dict:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            async with http.put(f"{self.cdp}/json/new?about:blank") as r:
                target = await r.json(content_type=None)
            try:
                async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    page = Page(ws)
                    await page.send("Page.enable")
                    await page.send("Page.navigate", url=url)
                    deadline = time.monotonic() + timeout
                    value, ok = None, False
                    while True:
                        try:
                            value = await page.evaluate(probe_js)
                            ok = bool(done(value))
                        except RuntimeError:  # mid-navigation: no document yet
                            pass
                        if ok or time.monotonic() > deadline:
                            break
                        await asyncio.sleep(0.5)
                    text = await page.evaluate("document.body ? document.body.innerText : ''") or ""
                    png = self.out / f"{shot}.png"
                    png.write_bytes(base64.b64decode((await page.send("Page.captureScreenshot"))["data"]))
                    (self.out / f"{shot}.txt").write_text(text)
            finally:
                async with http.get(f"{self.cdp}/json/close/{target['id']}") as r:
                    await r.read()
        return {"ok": ok, "text": text, "value": value, "screenshot": str(png)}

    def close(self) -> None:
        if self.proc is not None:
            stop(self.proc)


@pytest.fixture(scope="module")
def browser(e2e_dir):
    b = Chromium(e2e_dir)
    yield b
    b.close()


DEMO_ENV = ("TRACERL_CONFIG", "DAGSTER_HOME", "MLFLOW_TRACKING_URI")


@contextmanager
def demo_env(tmp: Path, bootstrap: str, name: str):
    """A demo's stack on the tiny model: its tracerl.toml (`stack_settings`: the simulated users'
    reward spec, a vLLM start timeout for busy cores, the repo's evals) in TRACERL_CONFIG, where the gateway process reads it too,
    and a fresh DAGSTER_HOME with the repo's run-queue limits. The environment is restored after;
    an earlier test's MLFLOW_TRACKING_URI must not leak in. Yields the toml's path."""
    from tests.conftest import write_stack_toml
    from tests.train.served_loop import stack_settings

    toml = write_stack_toml(tmp, bootstrap, name, stack_settings(""))
    saved = {k: os.environ.get(k) for k in DEMO_ENV}
    try:
        os.environ["TRACERL_CONFIG"] = str(toml)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        (tmp / "dagster_home").mkdir()
        shutil.copy(REPO / "dagster_home" / "dagster.yaml", tmp / "dagster_home")
        os.environ["DAGSTER_HOME"] = str(tmp / "dagster_home")
        yield toml
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@contextmanager
def dagster_webserver(cfg, dagster_home: Path):
    """The Dagster UI alone (no daemon, so no sensor starts runs of its own) on `dagster_home`,
    over `assets.definitions`, with cfg's tracerl home; yields its URL."""
    import sys

    from pipelines.services import process

    port = process.free_port()
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "TRACERL_HOME": str(cfg.home.resolve())}
    state = process.spawn("dagster-webserver", [str(Path(sys.executable).parent / "dagster-webserver"),
                                                "-m", "assets.definitions", "-h", "127.0.0.1", "-p", str(port)],
                          run_dir=cfg.run_dir, log=cfg.log_dir / "dagster-webserver.log", port=port,
                          url=f"http://127.0.0.1:{port}", env=env, cwd=REPO)
    try:
        process.wait_http(state, "/server_info", 180, cfg.run_dir)
        yield state.url
    finally:
        process.stop(cfg.run_dir, "dagster-webserver", timeout=30.0)
