"""Tenant API keys as the running gateway sees them: configured ones, and key files it follows
without a restart.

A tenant's key is ``gateway.api_keys[tenant]`` (configuration wins and is never revoked by a file)
or the file ``<home>/gateway/keys/<tenant>.key`` (one token, 0600). The gateway re-reads the folder
when its modification time changes (checked on every request: one ``stat``) and at least every
``KEY_RECHECK_S`` seconds (a key rewritten in place, or two changes within one tick of the file
system's clock). So a key file that appears (``tracerl tenant add``) works on the next request, and
one that is deleted (``tracerl tenant revoke``, or ``rm``) stops working on the next request, at
the latest ``KEY_RECHECK_S`` later. Writers (``write_key_file``) create a file whole, by a hard
link, never half-written, and then stamp the folder, so the next request sees the change.

A file that cannot serve as a key is skipped, never half-trusted: a name that is not a tenant id,
fewer than ``MIN_KEY_CHARS`` characters, or a token another tenant uses too (both are refused:
one key must mean one tenant). ``KeyRing.skipped`` says which and why.
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
from pathlib import Path
from typing import Callable

KEY_RECHECK_S = 1.0   # longest a rewritten or deleted key file keeps working unnoticed
MIN_KEY_CHARS = 16    # as gateway.api_keys: shorter tokens are guessable
KEY_BYTES = 24        # a generated key: 48 hex characters


def key_folder(home: Path) -> Path:
    return Path(home) / "gateway" / "keys"


def key_path(home: Path, tenant: str) -> Path:
    from pipelines.contract.validate import IDENT, short

    if not isinstance(tenant, str) or not IDENT.fullmatch(tenant):
        raise ValueError(f"tenant={short(tenant)} is not a tenant id; use [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return key_folder(home) / f"{tenant}.key"


def _stamp(folder: Path) -> None:
    """Set the folder's mtime to now at full precision: a reader that cached the coarse mtime of a
    change in the same clock tick still sees a new value."""
    now = time.time_ns()
    os.utime(folder, ns=(now, now))


def write_key_file(path: Path, nbytes: int = KEY_BYTES) -> tuple[str, bool]:
    """``(token, created)``: the token in ``path``, or a new random one written there (0600).

    The file appears whole: written to a temporary name, fsync'd, then hard-linked into place (the
    link fails if another writer got there first; its token is returned then)."""
    path = Path(path)
    if path.is_file():
        return path.read_text().strip(), False
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(nbytes)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return path.read_text().strip(), False
    finally:
        tmp.unlink(missing_ok=True)
    _stamp(path.parent)
    return token, True


def delete_key_file(path: Path) -> bool:
    """Remove a key file (revoking the key); False if there was none."""
    path = Path(path)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    _stamp(path.parent)
    return True


def read_key_files(folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    """``({tenant: key}, {file name: why skipped})`` for the ``*.key`` files of ``folder``."""
    from pipelines.contract.validate import IDENT

    keys, skipped = {}, {}
    if not Path(folder).is_dir():
        return keys, skipped
    for p in sorted(Path(folder).glob("*.key")):
        if not IDENT.fullmatch(p.stem):
            skipped[p.name] = f"{p.stem!r} is not a tenant id ([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})"
            continue
        try:
            token = p.read_text().strip()
        except (OSError, UnicodeDecodeError) as err:  # deleted meanwhile, unreadable, not text
            skipped[p.name] = f"unreadable: {type(err).__name__}"
            continue
        if len(token) < MIN_KEY_CHARS:
            skipped[p.name] = f"the key has {len(token)} characters, fewer than {MIN_KEY_CHARS}"
            continue
        keys[p.stem] = token
    return keys, skipped


class KeyRing:
    """key -> tenant for the gateway: the configured keys, plus the key files of ``folder``,
    re-read as the module docstring says. Single-threaded (the gateway's event loop)."""

    def __init__(self, configured: dict[str, str], folder: Path | None, reserved: tuple[str, ...] = (),
                 recheck_s: float = KEY_RECHECK_S, clock: Callable[[], float] = time.monotonic):
        """``reserved``: tokens no key file may hold (the admin key)."""
        self.configured, self.folder = dict(configured), Path(folder) if folder is not None else None
        self.reserved = frozenset(reserved)
        self.recheck_s, self._clock = recheck_s, clock
        self._by_key: dict[str, str] = {}
        self._key_of: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self._mtime: int | None = None
        self._checked = float("-inf")
        self.reloads = 0
        self.reload()

    def _folder_mtime(self) -> int | None:
        try:
            return os.stat(self.folder).st_mtime_ns if self.folder is not None else None
        except FileNotFoundError:
            return None

    def reload(self) -> list[str]:
        """Re-read the key files now; the tenants that have a key."""
        self._mtime, self._checked = self._folder_mtime(), self._clock()
        files, skipped = read_key_files(self.folder) if self.folder is not None else ({}, {})
        for tenant in [t for t, k in files.items() if k in self.reserved]:
            skipped[f"{tenant}.key"] = "holds a reserved key (the admin key)"
            del files[tenant]
        key_of = {**files, **self.configured}  # configured keys win
        owners: dict[str, list[str]] = {}
        for tenant, key in key_of.items():
            owners.setdefault(key, []).append(tenant)
        for tenants in owners.values():
            if len(tenants) > 1:  # file owners lose it; a configured owner (at most one) keeps it
                for t in tenants:
                    if t not in self.configured:
                        skipped[f"{t}.key"] = f"the same key as tenant(s) {sorted(set(tenants) - {t})}"
                        key_of.pop(t)
        self._key_of = key_of
        self._by_key = {k: t for t, k in key_of.items()}
        self.skipped = skipped
        self.reloads += 1
        return sorted(key_of)

    def _fresh(self) -> None:
        if self._folder_mtime() != self._mtime or self._clock() - self._checked >= self.recheck_s:
            self.reload()

    def tenant_of(self, key: str) -> str | None:
        """The tenant whose key ``key`` is, or None (unknown, revoked, or empty)."""
        self._fresh()
        tenant = self._by_key.get(key) if key else None
        if tenant is None or not hmac.compare_digest(self._key_of[tenant].encode(), key.encode()):
            return None
        return tenant

    def tenants(self) -> list[str]:
        self._fresh()
        return sorted(self._key_of)
