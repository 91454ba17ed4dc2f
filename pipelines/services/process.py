"""Background services tracerl starts itself (Kafka, MLflow, vLLM, the gateway, Dagster):
spawn, record, find again, stop. The one place that knows how.

A service's PID, port and log live in `<home>/run/<name>.json`. A second start finds the
recorded process alive and reuses it; stop signals only that process group (the service and
the children it forked: vLLM's EngineCore, Dagster's webserver and daemon), so `tracerl down`
never touches a server somebody else started on the same port. A PID is trusted only while
its start time in `/proc/<pid>/stat` is the recorded one: PIDs recycle, and vLLM renames its
processes (setproctitle), so the command line cannot identify them.

A leader killed -9 by someone else takes none of its children with it: they are forked by vLLM,
Dagster and MLflow, not by us, so no parent-death signal can be set on them. They stay in the
leader's process group, though, and Linux never reuses a PID as a PID while a group of that ID
exists: members of the recorded group started after the leader are its children. `stop` and the
next `spawn` of that service kill such a leaderless group (`leftovers`), so `tracerl down` / `up`
leave no orphan holding a port or a GPU.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterator, TypeVar

from pipelines.durable import file_lock

HOST = "127.0.0.1"


class ServiceError(RuntimeError):
    pass


@dataclass
class ProcessState:
    name: str
    pid: int
    pid_start: int               # field 22 of /proc/<pid>/stat: tells our PID from a recycled one
    port: int
    argv: list[str]              # what was started, for people reading the file
    log: str
    url: str
    started_at: float = field(default_factory=time.time)


S = TypeVar("S", bound=ProcessState)
_children: dict[int, subprocess.Popen] = {}  # processes this interpreter spawned, reaped on stop


def port_open(port: int, host: str = HOST) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port(preferred: int | None = None) -> int:
    """`preferred` when nothing listens there, else any free port."""
    if preferred and not port_open(preferred):
        return preferred
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after "pid (comm)" (comm may hold spaces), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def start_time(pid: int) -> int | None:
    """Start time of a live (non-zombie) process, or None."""
    f = _stat(pid)
    return None if f is None or f[0] in ("Z", "X") else int(f[19])


def group_members(pgid: int) -> list[int]:
    """Live PIDs in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (f := _stat(int(entry.name))) and int(f[2]) == pgid and f[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def alive(state: ProcessState) -> bool:
    return start_time(state.pid) == state.pid_start


def exited(state: ProcessState) -> str | None:
    """None while it runs; else how it ended (with the exit code when this interpreter spawned it)."""
    proc = _children.get(state.pid)
    if proc is not None and proc.poll() is not None:
        return f"exited with code {proc.returncode}"
    return None if alive(state) else "exited"


def state_path(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / f"{name}.json"


@contextmanager
def lock(run_dir: Path, name: str) -> Iterator[None]:
    """Serialize start/stop of one service across processes (two CLIs must not start two)."""
    with file_lock(Path(run_dir) / f"{name}.lock"):
        yield


def recorded(run_dir: Path, name: str, cls: type[S] = ProcessState) -> S | None:  # type: ignore[assignment]
    """The service recorded under `run_dir`, alive or not (None if no readable file)."""
    try:
        data = json.loads(state_path(run_dir, name).read_text())
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
    except (OSError, ValueError, TypeError):
        return None


def read_state(run_dir: Path, name: str, cls: type[S] = ProcessState) -> S | None:  # type: ignore[assignment]
    """The running service recorded under `run_dir`, or None (a stale or foreign file is ignored)."""
    state = recorded(run_dir, name, cls)
    return state if state is not None and alive(state) else None


def leftovers(state: ProcessState) -> list[int]:
    """Live members of the recorded service's process group started after its leader: what a
    leader killed -9 left behind (PIDs recycle, but not as the ID of a group still in use)."""
    return [p for p in group_members(state.pid) if (start_time(p) or 0) >= state.pid_start]


def write_state(run_dir: Path, state: ProcessState) -> None:
    path = state_path(run_dir, state.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    os.replace(tmp, path)


def spawn(name: str, argv: list[str], *, run_dir: Path, log: Path, port: int, url: str,
          env: dict[str, str] | None = None, cwd: Path | None = None, reap: bool = True,
          cls: type[S] = ProcessState, **extra) -> S:  # type: ignore[assignment]
    """Start `argv` in its own session (it outlives the CLI) and record it at once, so a caller
    that dies while the service starts up still leaves it stoppable."""
    prev = recorded(run_dir, name)
    if prev is not None and not alive(prev) and leftovers(prev):
        stop_group(prev)  # the children of a leader killed -9 still hold its port
    if port_open(port):  # else the health check below would pass on another program's answer
        raise ServiceError(f"{name}: port {port} is already in use by another program: free it, or set "
                           f"another port in the config")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n==== tracerl start {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
    _children[proc.pid] = proc
    state = cls(name=name, pid=proc.pid, pid_start=start_time(proc.pid) or 0, port=port, argv=list(argv),
                log=str(log), url=url, **extra)
    write_state(run_dir, state)
    if reap and state.pid_start:  # the leader's children die with it, even on kill -9 (reaper.py)
        subprocess.Popen([sys.executable, "-m", "pipelines.services.reaper", str(state.pid), str(state.pid_start)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    return state


def log_tail(state: ProcessState, chars: int = 1500) -> str:
    """The log's last `chars` bytes (logs grow across restarts: never read them whole)."""
    try:
        with open(state.log, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - chars))
            return fh.read().decode(errors="replace")
    except OSError:
        return "(no log)"


def wait_http(state: ProcessState, path: str, timeout: float, run_dir: Path) -> None:
    """Wait until `state.url + path` answers 200, or stop the service and fail with its log's tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not exited(state):
        try:
            with urllib.request.urlopen(state.url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    why = exited(state) or f"did not answer {state.url}{path} within {timeout:.0f}s"
    stop(run_dir, state.name)
    raise ServiceError(f"{state.name} {why}; log {state.log}:\n{log_tail(state)}")


def stop_group(state: ProcessState, timeout: float = 20.0) -> None:
    """SIGTERM the process group `state.pid` leads (spawn gives it one), SIGKILL what is left
    after `timeout`. Callers have just checked that `state.pid` is still ours."""
    proc = _children.pop(state.pid, None)
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not group_members(state.pid):
            break
        try:
            os.killpg(state.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()  # reap our child, else it lingers as a zombie
            if not group_members(state.pid):
                break
            time.sleep(0.2)
    if proc is not None:
        proc.poll()


def stop(run_dir: Path, name: str, timeout: float = 20.0) -> bool:
    """Stop the recorded service's process group, or what is left of it after its leader was
    killed; False if nothing of it was running."""
    state = recorded(run_dir, name)
    state_path(run_dir, name).unlink(missing_ok=True)
    if state is None or not (alive(state) or leftovers(state)):
        return False
    stop_group(state, timeout)
    return True
