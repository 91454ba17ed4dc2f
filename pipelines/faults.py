"""Failpoints: crash the process at a named point, for crash-recovery tests.

`TRACERL_FAILPOINT=ingest.after_manifest tracerl ingest` exits abruptly (no
cleanup, no finally blocks) right after the manifest is written: the same
state a power cut would leave. Unset, a failpoint costs one dict lookup.
"""

import os

EXIT_CODE = 86


def failpoint(name: str) -> None:
    if os.environ.get("TRACERL_FAILPOINT") == name:
        os._exit(EXIT_CODE)


class InjectedFault(RuntimeError):
    """What `fault` raises: an error where a test wants a component to survive one, not a crash."""


def fault(name: str) -> None:
    """Raise at a named point while `TRACERL_FAULT=name` (e.g. `emitter.batch`); unset, one lookup."""
    if os.environ.get("TRACERL_FAULT") == name:
        raise InjectedFault(f"injected fault at {name}")
