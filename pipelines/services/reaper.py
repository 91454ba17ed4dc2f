"""Kill what a service leaves behind the moment its leader dies, not at the next stop.

vLLM's EngineCore, Dagster's webserver and daemon and MLflow's workers are forked by those
programs, so no parent-death signal can be set on them: kill -9 the leader and they run on
(measured: vLLM's three children outlived its API server's kill -9 by 20 s and more, until a
stop). `process.spawn` starts one reaper per service, in its own session: it polls the leader
and, once the leader is gone, gives its children `GRACE_S` to finish a shutdown of their own,
then SIGKILLs every member of the leader's process group started after it (a process group ID
is not reused while the group has members, and the start time rules out a recycled leader PID).
If the reaper itself is killed, `stop` and the next `spawn` still clean up (`process.leftovers`).

    python -m pipelines.services.reaper PID PID_START
"""

from __future__ import annotations

import os
import signal
import sys
import time

from pipelines.services.process import group_members, start_time

POLL_S = 0.5
GRACE_S = 5.0


def watch(pid: int, pid_start: int, poll_s: float = POLL_S, grace_s: float = GRACE_S) -> list[int]:
    """Wait for the leader to die, then kill what it left; returns the PIDs killed."""
    while start_time(pid) == pid_start:
        time.sleep(poll_s)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _left(pid, pid_start):
        time.sleep(poll_s)
    killed = []
    for p in _left(pid, pid_start):
        try:
            os.kill(p, signal.SIGKILL)
            killed.append(p)
        except OSError:
            pass
    return killed


def _left(pid: int, pid_start: int) -> list[int]:
    return [p for p in group_members(pid) if p != os.getpid() and (start_time(p) or 0) >= pid_start]


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
