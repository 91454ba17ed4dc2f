"""Versioned adapter store: ``<root>/<tenant>/<task>/v<N>/`` = PEFT files + ``tracerl.json``.

Readers (the gate, the deployer, the next learner step) must never load a half-written
adapter. A version is written into a hidden temp folder beside its final place, fsynced, given
a ``READY`` marker, and renamed into place (directory rename is atomic on one filesystem).
Readers list only ``v<N>`` folders holding ``READY``; a crash leaves a hidden ``.tmp-*`` folder
that nobody lists. Version numbers are taken under an ``flock`` on the task folder, so two
publishers on one host never race for the same N. Torch-free: the deployer imports this.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from pipelines.adapters.version import folder_version, label, lora_name
from pipelines.contract.validate import short
from pipelines.durable import fsync_tree

READY = "READY"
META = "tracerl.json"
MARKS = "tracerl.marks.json"  # marks added after publishing (``AdapterStore.mark``); never part of the weights
FORGOTTEN = "trained_on_forgotten_user"  # mark: {forget request id: {"policy", "why"}} (pipelines/rights/forget.py)
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")
REQUIRED_META = ("parent_version", "base_model_hash", "data_window", "reward_spec_version", "config", "metrics")
# Used with fullmatch only: `$` would also match before a trailing newline ("acme\n").
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # no '/', no leading '.', so no '..'


def check_id(value: str, what: str) -> str:
    """Reject ids that could escape the store or hide ('a/b', '..', '.x', '', spaces)."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise ValueError(f"{what}={short(value)} is not a safe id; use 1-128 of [A-Za-z0-9_.-], starting with a letter or digit")
    return value


def write_folder_atomically(dest: Path, fill: Callable[[Path], None]) -> Path:
    """Create ``dest`` whole or not at all: ``fill(tmp)`` writes into a hidden sibling, then rename.

    Refuses an existing ``dest`` (an adapter folder is never overwritten in place).
    """
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists; adapters are immutable, write to a new folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        fill(tmp)
        fsync_tree(tmp)
        os.rename(tmp, dest)  # fails if dest appeared meanwhile and is non-empty
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


@dataclass(frozen=True)
class AdapterVersion:
    tenant: str
    task: str
    version: int
    path: Path
    meta: dict[str, Any]

    @property
    def name(self) -> str:
        """The vLLM ``lora_name``: '<tenant>/<task>/v<N>'."""
        return lora_name(self.tenant, self.task, self.version)


class AdapterStore:
    """Adapters by tenant and task, each version immutable once published."""

    def __init__(self, root: Path):
        self.root = Path(root).expanduser().resolve()

    def _task_dir(self, tenant: str, task: str) -> Path:
        return self.root / check_id(tenant, "tenant") / check_id(task, "task")

    @contextmanager
    def _lock(self, tenant: str, task: str) -> Iterator[None]:
        folder = self._task_dir(tenant, task)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _numbers(self, tenant: str, task: str, ready_only: bool) -> list[int]:
        folder = self._task_dir(tenant, task)
        if not folder.is_dir():
            return []
        nums = []
        for child in folder.iterdir():
            n = folder_version(child.name)
            if n is not None and child.is_dir() and (not ready_only or (child / READY).is_file()):
                nums.append(n)
        return sorted(nums)

    def next_version(self, tenant: str, task: str) -> int:
        """1 + the highest ``v<N>`` folder (finished or not), 1 for a new task."""
        nums = self._numbers(tenant, task, ready_only=False)
        return (nums[-1] + 1) if nums else 1

    def publish(self, tenant: str, task: str, src_dir: Path, meta: dict[str, Any]) -> AdapterVersion:
        """Copy the PEFT folder ``src_dir`` in as the next version, with ``meta`` in tracerl.json.

        ``meta`` needs ``REQUIRED_META`` (parent_version may be None; it must name a published
        version otherwise). The store adds tenant, task, version and created_at.
        """
        src_dir = Path(src_dir)
        missing_files = [f for f in PEFT_FILES if not (src_dir / f).is_file()]
        if missing_files:
            raise FileNotFoundError(f"{src_dir} lacks {missing_files}; pass a folder written by save_pretrained")
        missing = [k for k in REQUIRED_META if k not in meta]
        if missing:
            raise ValueError(f"adapter meta lacks {missing}; required: {list(REQUIRED_META)}")
        reserved = sorted({"tenant", "task", "version", "created_at"} & set(meta))
        if reserved:
            raise ValueError(f"adapter meta sets {reserved}; the store assigns those")
        with self._lock(tenant, task):
            parent = meta["parent_version"]
            if parent is not None and int(parent) not in self._numbers(tenant, task, ready_only=True):
                raise ValueError(f"parent_version={parent!r} is not a published version of {tenant}/{task}")
            version = self.next_version(tenant, task)
            record = {"tenant": tenant, "task": task, "version": version,
                      "created_at": datetime.now(timezone.utc).isoformat(), **meta}
            text = json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"

            def fill(tmp: Path) -> None:
                for child in sorted(src_dir.iterdir()):
                    if child.is_file():
                        shutil.copy2(child, tmp / child.name)
                (tmp / META).write_text(text)
                (tmp / READY).write_text(json.dumps({"version": version}) + "\n")  # last

            write_folder_atomically(self._task_dir(tenant, task) / label(version), fill)
        return self.get(tenant, task, version)  # re-read: exactly what readers will see

    def get(self, tenant: str, task: str, version: int) -> AdapterVersion:
        path = self._task_dir(tenant, task) / label(version)
        if not (path / READY).is_file():
            raise KeyError(f"{lora_name(tenant, task, version)} is not a published adapter (no {READY} in {path})")
        meta = json.loads((path / META).read_text())
        marks = path / MARKS
        if marks.is_file():
            meta["marks"] = json.loads(marks.read_text())
        return AdapterVersion(tenant, task, int(version), path, meta)

    def mark(self, tenant: str, task: str, version: int, key: str, entry: str, value: Any) -> dict[str, Any]:
        """Add ``{key: {entry: value}}`` to the version's marks (``meta["marks"]`` on reading): a
        sidecar written atomically beside the immutable files, under the task's lock. Idempotent."""
        from pipelines.durable import write_json_atomic

        av = self.get(tenant, task, version)
        with self._lock(tenant, task):
            path = av.path / MARKS
            marks = json.loads(path.read_text()) if path.is_file() else {}
            if marks.get(key, {}).get(entry) != value:
                marks.setdefault(key, {})[entry] = value
                write_json_atomic(path, marks)
        return marks

    def targets(self) -> list[tuple[str, str]]:
        """Every (tenant, task) with a folder in the store, sorted (folders with unsafe names skipped)."""
        if not self.root.is_dir():
            return []
        return sorted((a.name, b.name) for a in self.root.iterdir() if a.is_dir() and _ID.fullmatch(a.name)
                      for b in a.iterdir() if b.is_dir() and _ID.fullmatch(b.name))

    def list(self, tenant: str, task: str) -> list[AdapterVersion]:
        """Published versions, oldest first."""
        return [self.get(tenant, task, n) for n in self._numbers(tenant, task, ready_only=True)]

    def latest(self, tenant: str, task: str) -> AdapterVersion | None:
        nums = self._numbers(tenant, task, ready_only=True)
        return self.get(tenant, task, nums[-1]) if nums else None

    def lineage(self, tenant: str, task: str, version: int) -> list[AdapterVersion]:
        """The version and its ancestors, newest first, following ``parent_version``."""
        chain: list[AdapterVersion] = []
        current: int | None = int(version)
        while current is not None:
            if len(chain) > 100_000:
                raise RuntimeError(f"{tenant}/{task}: parent_version chain does not end (cycle?)")
            av = self.get(tenant, task, current)
            chain.append(av)
            parent = av.meta.get("parent_version")
            current = None if parent is None else int(parent)
        return chain
