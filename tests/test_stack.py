"""The local stack's own services (MLflow UI, Dagster) and the process bookkeeping behind `up`/`down`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from pipelines.config import TracerlConfig
from pipelines.services import process
from pipelines import stack


def test_spawn_reuse_and_stop_only_ours(tmp_path):
    run, port = tmp_path / "run", process.free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    state = process.spawn("web", argv, run_dir=run, log=tmp_path / "web.log", port=port,
                          url=f"http://127.0.0.1:{port}")
    process.wait_http(state, "/", 30, run)
    assert process.read_state(run, "web").pid == state.pid
    # a stranger on another port is not ours: stop leaves it alone
    other = subprocess.Popen([sys.executable, "-m", "http.server", str(process.free_port()), "--bind", "127.0.0.1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert process.stop(run, "web") is True
        assert process.read_state(run, "web") is None and not process.port_open(port)
        assert other.poll() is None
        assert process.stop(run, "web") is False  # nothing left to stop
    finally:
        other.kill()


def test_a_taken_port_moves_to_a_free_one():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert process.free_port(taken) != taken
    assert process.free_port(taken) == taken  # free again


def test_a_service_refuses_a_port_another_program_answers_on(tmp_path):
    """Else its health check would pass on the stranger's answer and every call would reach it."""
    run, port = tmp_path / "run", process.free_port()
    other = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: process.port_open(port))
        with pytest.raises(process.ServiceError, match=f"web: port {port} is already in use"):
            process.spawn("web", [sys.executable, "-c", "pass"], run_dir=run, log=tmp_path / "web.log",
                          port=port, url=f"http://127.0.0.1:{port}")
        assert process.read_state(run, "web") is None  # nothing started, nothing recorded
    finally:
        other.kill()


def wait_until(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_recycled_pid_is_not_trusted(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.Popen(["sleep", "30"])
    try:  # a state file naming a live PID that is some other, later process than the recorded one
        started = process.start_time(proc.pid)
        process.state_path(run, "mlflow").write_text(
            f'{{"name": "mlflow", "pid": {proc.pid}, "pid_start": {started - 1}, "port": 1, '
            f'"argv": ["mlflow", "server"], "log": "x", "url": "x"}}')
        assert process.read_state(run, "mlflow") is None
        assert process.stop(run, "mlflow") is False and proc.poll() is None
    finally:
        proc.kill()


def test_mlflow_and_dagster_up_status_down(tmp_path):
    cfg = TracerlConfig(home=tmp_path / "home")
    from pipelines.services import mlflow_server

    m = mlflow_server.start_mlflow(cfg)
    try:
        assert stack.status(cfg, "mlflow") == f"running on {m.url} (pid {m.pid})"
        with urllib.request.urlopen(f"{m.url}/health", timeout=10) as r:
            assert r.status == 200
        assert stack.start(cfg, "mlflow").startswith(m.url)  # a second start reuses it
        assert mlflow_server.read_state(cfg).pid == m.pid
        # the UI serves the same store the pipelines write
        from pipelines.tracking import client, experiment_id

        experiment_id(cfg, "from-the-library")
        with urllib.request.urlopen(f"{m.url}/api/2.0/mlflow/experiments/get-by-name"
                                    f"?experiment_name=from-the-library", timeout=10) as r:
            assert b"from-the-library" in r.read()
        assert client(cfg)

        line = stack.start(cfg, "dagster")
        d = process.read_state(cfg.run_dir, "dagster")
        assert line.startswith(d.url)
        with urllib.request.urlopen(f"{d.url}/server_info", timeout=10) as r:
            assert r.status == 200
    finally:
        assert stack.stop(cfg, "dagster") is True
        assert stack.stop(cfg, "mlflow") is True
    assert stack.status(cfg, "mlflow") == "stopped" and stack.status(cfg, "dagster") == "stopped"
    assert not process.port_open(m.port)


def test_children_of_a_leader_killed_9_are_stopped_by_stop_and_by_the_next_spawn(tmp_path):
    """Someone kill -9s a service's leader and its reaper: its children (forked by the service, as
    vLLM's EngineCore or Dagster's webserver are) outlive it, still in its process group. `stop`
    kills them, and so does the next `spawn` of that service (they would hold its port)."""
    import os
    import signal
    import time

    run = tmp_path / "run"
    leader = [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"]

    def start():  # without the reaper: the fallback when it was killed too
        state = process.spawn("svc", leader, run_dir=run, log=tmp_path / "svc.log", port=1, url="x", reap=False)
        deadline = time.monotonic() + 30
        while len(process.group_members(state.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = [p for p in process.group_members(state.pid) if p != state.pid]
        os.kill(state.pid, signal.SIGKILL)
        process._children[state.pid].wait()
        time.sleep(0.3)
        assert process.start_time(child) is not None, "the child died with its leader after all"
        assert process.read_state(run, "svc") is None and process.leftovers(state) == [child]
        return state, child

    state, child = start()
    assert process.stop(run, "svc") is True
    assert process.start_time(child) is None and not process.group_members(state.pid)
    assert process.stop(run, "svc") is False

    state, child = start()
    again = process.spawn("svc", [sys.executable, "-c", "import time; time.sleep(300)"], run_dir=run,
                          log=tmp_path / "svc.log", port=1, url="x")
    try:
        assert process.start_time(child) is None  # the orphan went before the new leader started
    finally:
        process.stop(run, "svc")
    assert process.read_state(run, "svc") is None and process.start_time(again.pid) is None


def test_children_of_a_leader_killed_9_die_within_seconds_by_its_reaper(tmp_path):
    """With the reaper `spawn` starts, a kill -9 of the leader takes its children along within
    the reaper's grace period, with no `stop` or later `spawn` (pipelines/services/reaper.py)."""
    import os
    import signal
    import time

    from pipelines.services import reaper

    run = tmp_path / "run"
    leader = [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"]
    state = process.spawn("svc", leader, run_dir=run, log=tmp_path / "svc.log", port=1, url="x")
    deadline = time.monotonic() + 30
    while len(process.group_members(state.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = [p for p in process.group_members(state.pid) if p != state.pid]
    try:
        os.kill(state.pid, signal.SIGKILL)
        process._children[state.pid].wait()
        deadline = time.monotonic() + reaper.GRACE_S + 10
        while process.start_time(child) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.start_time(child) is None, "the leader's child outlived it"
        assert not process.leftovers(state)
    finally:
        process.stop(run, "svc")
