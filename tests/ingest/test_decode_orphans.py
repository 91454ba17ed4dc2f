"""A kill -9 of ingest leaves no decode worker (nor multiprocessing's resource tracker) behind.

An orphan worker once held ingest's pipes and made the next run hang. The workers ask the kernel
to SIGKILL them when their parent dies (`decode.die_with_parent`); the resource tracker exits
when the last holder of its pipe is gone. Linux only (/proc, prctl).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux")

BUSY_INGEST = textwrap.dedent("""
    import json, sys
    from pipelines.ingest.decode import Chunk, Decoder
    from pipelines.ingest.sample import generate
    values = [json.dumps(e.to_dict()).encode() for e in generate(3000, seed=1)] * 4
    n = len(values)
    d = Decoder(1 << 20, 2, "run", 1_700_000_000_000, parallel_from=1)
    for part in range(2):
        d.submit(Chunk("t", part, 0, list(range(n)), [1] * n, [b"k"] * n, values))
    print("submitted", flush=True)
    d.results()
    print("done", flush=True)
""")


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a live process, or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[1]), fields[0], int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every live process below `root`."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))):
            parents[int(entry.name)] = st
    out, frontier = {}, [root]
    while frontier:
        p = frontier.pop()
        for pid, (ppid, _, start) in parents.items():
            if ppid == p and pid not in out:
                out[pid] = start
                frontier.append(pid)
    return out


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[2] == start and st[1] != "Z"  # same process, not a zombie


def test_kill_9_of_ingest_leaves_no_decode_worker_or_tracker():
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", BUSY_INGEST], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "submitted"
        children: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while len(children) < 3 and time.monotonic() < deadline:  # two workers and the resource tracker
            children = _descendants(proc.pid)
            time.sleep(0.05)
        assert len(children) >= 3, children
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 5
        while (left := [p for p, s in children.items() if _alive(p, s)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == [], f"orphans after kill -9 of their parent: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
