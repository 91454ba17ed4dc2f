"""Failpoints: crash or hold the process at a named point, for crash and concurrency tests.

`TRACERL_FAILPOINT=ingest.after_commit tracerl ingest` exits abruptly (no
cleanup, no finally blocks) right after the events commit: the state a kill
leaves. `TRACERL_PAUSE=ingest.before_commit:<file>` waits there until <file>
exists (after touching <file>.<pid>), so a test lines two processes up at one
point. Unset, a failpoint costs two dict lookups.
"""

import os
import time
from pathlib import Path

EXIT_CODE = 86


def failpoint(name: str) -> None:
    if os.environ.get("TRACERL_FAILPOINT") == name:
        os._exit(EXIT_CODE)
    pause = os.environ.get("TRACERL_PAUSE")
    if pause and pause.split(":", 1)[0] == name:
        gate = Path(pause.split(":", 1)[1])
        Path(f"{gate}.{os.getpid()}").touch()
        while not gate.exists():
            time.sleep(0.01)


class InjectedFault(RuntimeError):
    """What `fault` raises: an error where a test wants a component to survive one, not a crash."""


def fault(name: str) -> None:
    """Raise at a named point while `TRACERL_FAULT=name` (e.g. `emitter.batch`); unset, one lookup."""
    if os.environ.get("TRACERL_FAULT") == name:
        raise InjectedFault(f"injected fault at {name}")
