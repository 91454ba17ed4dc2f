"""End users as keyed pseudonyms: ``u_`` + 32 hex digits, HMAC-SHA256 of the user id with a secret
of the tenant's own, so the lake never holds an app's user id in clear.

- Deterministic per tenant: the same user of one tenant is the same pseudonym on every event, from
  the gateway or from ingest, so per-user questions (consent, forget) find all their events.
- Different across tenants: each tenant has its own secret, so one tenant's pseudonyms say
  nothing about another's users, and no table joins them.
- Keyed: without the secret a pseudonym cannot be recomputed from a guessed id (a plain hash of
  an e-mail address can). Whoever holds the secret (the operator) can compute a user's
  pseudonym from their id: that is how ``forget`` finds them, and why the secret is guarded.

The secret: 32 random bytes, as hex, in ``<home>/privacy/secrets/<tenant>.key`` (folder 0700, file
0600), created on first use: written aside, fsync'd, then hard-linked into place, so two processes
that create it at once (the gateway and an ingest worker) agree on the first one linked, and no
reader ever sees half a file. Losing it changes every pseudonym of the tenant from then on (old
events keep the old ones): back it up with the home. Gateways and ingest workers must share the
home (they do already for the API keys and the adapter store).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
from pathlib import Path
from typing import Any

from pipelines.contract.validate import IDENT
from pipelines.durable import fsync_dir

PREFIX = "u_"
HEX_CHARS = 32  # 128 bits of the HMAC: collisions are out of reach at any number of users
PATTERN = re.compile(rf"{PREFIX}[0-9a-f]{{{HEX_CHARS}}}")
SECRET_BYTES = 32

_cache: dict[tuple[str, str], bytes] = {}
_lock = threading.Lock()


class SecretError(RuntimeError):
    """A tenant's secret file exists but is not one (never silently replaced: every pseudonym would change)."""


def _home(home_or_cfg: Any) -> Path:
    """A home folder, or anything with a ``home`` (``TracerlConfig``)."""
    return Path(home_or_cfg if isinstance(home_or_cfg, (str, os.PathLike)) else home_or_cfg.home)


def secret_path(home_or_cfg: Any, tenant: str) -> Path:
    if type(tenant) is not str or not IDENT.fullmatch(tenant):
        raise ValueError(f"tenant {tenant!r} must match {IDENT.pattern}")
    return _home(home_or_cfg) / "privacy" / "secrets" / f"{tenant}.key"


def _read(path: Path) -> bytes:
    text = path.read_text().strip()
    if not re.fullmatch(rf"[0-9a-f]{{{2 * SECRET_BYTES}}}", text):
        raise SecretError(f"{path} is not a tenant secret ({2 * SECRET_BYTES} hex digits); restore it from a "
                          "backup: a new secret would give every user of the tenant a new pseudonym")
    return bytes.fromhex(text)


def _create(path: Path) -> None:
    """Write a new secret to ``path`` unless one is there; the first one linked wins."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(SECRET_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic, and fails where the file exists: never overwrites
        except FileExistsError:
            pass  # another process created it first: theirs is the secret
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)


def tenant_secret(home_or_cfg: Any, tenant: str) -> bytes:
    """The tenant's secret, created on first use (cached per process)."""
    key = (str(_home(home_or_cfg)), tenant)
    found = _cache.get(key)
    if found is not None:
        return found
    path = secret_path(home_or_cfg, tenant)
    with _lock:
        if key not in _cache:
            if not path.exists():
                _create(path)
            _cache[key] = _read(path)
        return _cache[key]


def pseudonym(home_or_cfg: Any, tenant: str, raw_user: str) -> str:
    """``raw_user`` of ``tenant`` as its pseudonym: ``u_`` + the first 32 hex digits of
    HMAC-SHA256(tenant secret, user id as UTF-8)."""
    if type(raw_user) is not str:
        raise TypeError(f"a user id is a string, got {type(raw_user).__name__}")
    digest = hmac.new(tenant_secret(home_or_cfg, tenant), raw_user.encode("utf-8", "surrogatepass"), hashlib.sha256)
    return PREFIX + digest.hexdigest()[:HEX_CHARS]


def is_pseudonym(value: Any) -> bool:
    """Whether ``value`` is in the pseudonym format (what ingest keeps as it is)."""
    return type(value) is str and PATTERN.fullmatch(value) is not None


def as_pseudonym(home_or_cfg: Any, tenant: str, user: str) -> str:
    """``user`` if it is a pseudonym already (the gateway's), else its pseudonym (a direct producer's id)."""
    return user if is_pseudonym(user) else pseudonym(home_or_cfg, tenant, user)


def clear_cache() -> None:
    """Forget the cached secrets (tests that delete a home)."""
    with _lock:
        _cache.clear()
