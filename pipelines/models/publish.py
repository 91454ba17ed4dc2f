"""Atomic, cached publication of a model folder.

Why: a model folder is read by other processes (the learner, vLLM, the gate). A reader must
never see a half-written folder, and a crashed build must not look finished. So a build writes
into a hidden temp folder next to the target, fsyncs every file, writes a ``READY`` marker
last, and renames the folder into place (``rename(2)`` of a directory is atomic on one
filesystem). A folder is "built" iff its ``READY`` marker exists and records the same build
parameters; anything else is rebuilt or refused.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

from pipelines.durable import fsync_tree

READY = "READY"


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The JSON in ``folder/READY``, or None when the folder is not a finished build."""
    marker = Path(folder) / READY
    if not marker.is_file():
        return None
    return json.loads(marker.read_text())


def is_ready(folder: Path, params: dict[str, Any]) -> bool:
    """True when ``folder`` is a finished build made with exactly ``params``."""
    marker = read_marker(folder)
    return marker is not None and marker.get("params") == params


def publish(out_dir: Path, params: dict[str, Any], build: Callable[[Path], dict[str, Any] | None]) -> Path:
    """Return ``out_dir`` built with ``params``, calling ``build(tmp_dir)`` only when needed.

    ``build`` writes the folder's files into ``tmp_dir`` and may return extra JSON-able facts
    to record in the marker. ``params`` identify the build: a finished folder with other params
    is replaced (old one removed after the new one is in place). A folder without a marker that
    we did not create is refused, not deleted: it may be the user's.
    """
    out_dir = Path(out_dir).expanduser().resolve()
    if is_ready(out_dir, params):
        return out_dir
    if out_dir.exists() and read_marker(out_dir) is None:
        raise FileExistsError(
            f"{out_dir} exists but has no {READY} marker, so it is not a finished tracerl build; "
            f"remove it or choose another folder")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        facts = build(tmp) or {}
        marker = {"params": params, **facts}
        (tmp / READY).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        fsync_tree(tmp)
        old = None
        if out_dir.exists():  # a finished build with other params: move it aside first
            old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(out_dir, old)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            # Another process published first (rename onto a non-empty folder fails):
            # keep theirs if it matches, else report.
            if is_ready(out_dir, params):
                shutil.rmtree(tmp)
                if old is not None:
                    shutil.rmtree(old)
                return out_dir
            if old is not None and not out_dir.exists():
                os.rename(old, out_dir)  # put the previous build back
            raise
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        if tmp.exists():
            shutil.rmtree(tmp)
        raise
    return out_dir
