"""Background services tracerl starts itself: spawn, record, find again, stop.

A service's PID, port and log live in `<home>/run/<name>.json`. A second start finds the
recorded process alive and reuses it; stop signals only that process group, so
`tracerl down` never touches a server somebody else started on the same port. A PID is
trusted only while `/proc/<pid>/cmdline` still shows the command we started (PIDs recycle).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path


class ServiceError(RuntimeError):
    pass


@dataclass
class ProcessState:
    name: str
    pid: int
    port: int
    argv: list[str]              # checked against /proc/<pid>/cmdline to detect PID reuse
    log: str
    url: str
    started_at: float = field(default_factory=time.time)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port(preferred: int | None = None) -> int:
    """`preferred` when nothing listens there, else any free port."""
    if preferred and not port_open(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int, argv: list[str]) -> bool:
    """True while `pid` runs `argv` (a script may show as `<interpreter> <script> ...`)."""
    try:
        cmd = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
    except OSError:
        return False
    tail = argv[1:]
    return (len(cmd) >= len(argv) and (not tail or cmd[-len(tail):] == tail)
            and os.path.basename(argv[0]) in {os.path.basename(a) for a in cmd[:len(cmd) - len(tail)]})


def state_path(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.json"


def read_state(run_dir: Path, name: str) -> ProcessState | None:
    path = state_path(run_dir, name)
    try:
        state = ProcessState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return state if alive(state.pid, state.argv) else None


def spawn(name: str, argv: list[str], *, run_dir: Path, log: Path, port: int, url: str,
          env: dict[str, str] | None = None, cwd: Path | None = None) -> ProcessState:
    """Start `argv` in its own session (it outlives the CLI) and record it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
    state = ProcessState(name, proc.pid, port, list(argv), str(log), url)
    state_path(run_dir, name).write_text(json.dumps(asdict(state)))
    return state


def wait_http(state: ProcessState, path: str, timeout: float, run_dir: Path) -> None:
    """Wait until `state.url + path` answers 200, or fail with the log's tail."""
    deadline = time.monotonic() + timeout
    gone = 0
    while time.monotonic() < deadline:
        gone = 0 if alive(state.pid, state.argv) else gone + 1
        if gone >= 3:  # not one read: /proc is briefly empty while a process execs
            break
        try:
            with urllib.request.urlopen(state.url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    tail = Path(state.log).read_text(errors="replace")[-1500:] if Path(state.log).exists() else ""
    stop(run_dir, state.name)
    raise ServiceError(f"{state.name} did not answer {state.url}{path} within {timeout:.0f}s; "
                       f"log {state.log}:\n{tail}")


def stop(run_dir: Path, name: str, timeout: float = 20.0) -> bool:
    """SIGTERM the recorded process group, SIGKILL after `timeout`; False if none was running."""
    state = read_state(run_dir, name)
    state_path(run_dir, name).unlink(missing_ok=True)
    if state is None:
        return False
    try:
        os.killpg(state.pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while alive(state.pid, state.argv) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(state.pid, state.argv):
        os.killpg(state.pid, signal.SIGKILL)
    return True
