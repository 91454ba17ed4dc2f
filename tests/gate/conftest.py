"""A real MLflow tracking server + registry (SQLite) for the gate's integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

MLFLOW = Path(sys.executable).parent / "mlflow"


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen([str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.3)
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()
