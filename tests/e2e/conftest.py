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
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHROMIUM_NAMES = ("chromium", "chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--disable-dev-shm-usage", "--window-size=1600,1000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: Path, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"{what} did not start: {log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.3)


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
def dagster_ui(e2e_dir):
    """`dagster-webserver -m assets.definitions` on a fresh DAGSTER_HOME; yields its base URL."""
    home = e2e_dir / "dagster_home"
    home.mkdir()
    if (REPO / "dagster_home" / "dagster.yaml").exists():
        shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    log_path = e2e_dir / "dagster-webserver.log"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(BIN / "dagster-webserver"), "-m", "assets.definitions",
                                 "-h", "127.0.0.1", "-p", str(port)],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/server_info", proc, log_path, "dagster-webserver")
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def mlflow_ui(e2e_dir):
    """A real MLflow server (SQLite registry) with the model `acme.concise`, version 1 aliased `champion`.

    Registered the way pipelines/registry.py does it: a run with an `adapter` artifact folder,
    a model version whose source is `runs:/<run_id>/adapter`, then the alias.
    Yields (base URL, model name, version).
    """
    from mlflow import MlflowClient

    from pipelines.registry import CHAMPION, model_name

    root = e2e_dir / "mlflow"
    root.mkdir()
    port = free_port()
    log_path = root / "server.log"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                                 "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1",
                                 "--port", str(port), "--workers", "1"],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", proc, log_path, "mlflow server")
        c = MlflowClient(tracking_uri=url, registry_uri=url)
        run = c.create_run(c.create_experiment("e2e"))
        adapter = root / "adapter"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text('{"r": 8}')
        c.log_artifacts(run.info.run_id, str(adapter), "adapter")
        c.set_terminated(run.info.run_id)
        name = model_name("acme", "concise")
        c.create_registered_model(name, tags={"tenant": "acme", "task": "concise"})
        mv = c.create_model_version(name, source=f"runs:/{run.info.run_id}/adapter", run_id=run.info.run_id,
                                    tags={"adapter_version": "1"})
        c.set_registered_model_alias(name, CHAMPION, mv.version)
        yield url, name, str(mv.version)
    finally:
        stop(proc)


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
