"""End users' consent to be trained on, per tenant: an append-only Delta table in the lake.

Besides a request's own ``train: false``, a tenant records per user whether they may be trained
on (``tracerl consent set``, ``record_consent`` for the gateway's admin route). One row per
decision, never updated or deleted by this module:

    tenant (partition), user_id (the tenant's pseudonym, ``u_`` + 32 hex, never the app's id in
    clear: `pipelines/privacy/pseudonym.py`), consent (true = opt-in, false = opt-out),
    effective_at (when it takes effect, UTC; default: when it is recorded), recorded_at,
    actor (who recorded it), reason (optional, free text)

What a record means, per tenant (``[privacy]``, `pipelines/config/privacy.py`):

- a user's state at time ``τ`` is their latest record with ``effective_at <= τ`` (two at the same
  instant: the opt-out wins); a user with none then follows ``privacy.consent_default``, and so
  does a turn with no user;
- a turn is trained on (new turns and replay, `pipelines/train/run.py` and `replay.py`) only if
  its user consented at its ``event_time``: an opt-out excludes the turns from it on;
- with ``privacy.consent_retroactive``, an opt-out also excludes the user's turns from before it
  (their landed turns leave the training pool and the replay pool); a later opt-in covers the
  turns from then on, never those an opt-out took out.

Excluded turns still land, are served and get their rewards (measured, never trained on). The
check is SQL over the turns view (`consented_sql`), evaluated by each selection, so a record
applies to the next selection wherever the learner runs; nothing is rewritten. It lives here,
beside the ledger, so the learner and the gateway's admin route (above the lake) both use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import duckdb
import pyarrow as pa

from pipelines.contract.validate import IDENT, short
from pipelines.lake import delta
from pipelines.lake.delta import CONSENT, EVENTS
from pipelines.privacy.pseudonym import PATTERN as PSEUDONYM

__all__ = ["CONSENT", "CONSENT_SCHEMA", "ConsentError", "ConsentRecord", "Policy", "USER_COLUMN", "check_pseudonym",
           "consent_source", "consented_sql", "latest", "policy", "record_consent", "records", "tenants_with_data"]

USER_COLUMN = "user_id"  # the turns view's column with the turn's user pseudonym (NULL: no user)
MAX_ACTOR = 256    # characters of `actor`
MAX_REASON = 1000  # characters of `reason`
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # one line of text each, as a user id (validate.py)

TS_US = pa.timestamp("us", tz="UTC")
CONSENT_SCHEMA = pa.schema([("user_id", pa.string()), ("consent", pa.bool_()), ("effective_at", TS_US),
                            ("recorded_at", TS_US), ("actor", pa.string()), ("reason", pa.string())])


class ConsentError(ValueError):
    """A consent record refused; the message says which field and why."""


@dataclass(frozen=True)
class ConsentRecord:
    tenant: str
    user_id: str            # the tenant's pseudonym of the user
    consent: bool           # True: may be trained on; False: opted out
    effective_at: datetime  # UTC
    recorded_at: datetime   # UTC
    actor: str
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "user": self.user_id, "consent": self.consent,
                "effective_at": _iso(self.effective_at), "recorded_at": _iso(self.recorded_at),
                "actor": self.actor, "reason": self.reason}


@dataclass(frozen=True)
class Policy:
    """A tenant's consent policy (``[privacy]``, per tenant)."""

    default: bool      # privacy.consent_default: a user with no record (or a turn with no user)
    retroactive: bool  # privacy.consent_retroactive: an opt-out also takes their earlier turns out


def policy(cfg: Any, tenant: str) -> Policy:
    """``tenant``'s consent policy: its ``[targets."<tenant>".privacy]`` over the global ``[privacy]``."""
    p = cfg.for_target(tenant).privacy
    return Policy(bool(p.consent_default), bool(p.consent_retroactive))


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _text(value: Any, name: str, limit: int, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if type(value) is not str:
        raise ConsentError(f"{name} must be a string, got {type(value).__name__}")
    if not value.strip():
        if optional:
            return None
        raise ConsentError(f"{name} must not be empty")
    if len(value) > limit:
        raise ConsentError(f"{name} is {len(value)} characters, over the {limit}-character limit")
    bad = CONTROL.search(value)
    if bad:
        raise ConsentError(f"{name} holds the control character U+{ord(bad.group()):04X} at character {bad.start()}")
    return value


def _check_tenant(tenant: Any) -> str:
    if type(tenant) is not str or not IDENT.fullmatch(tenant):
        raise ConsentError(f"tenant {short(str(tenant))} must match {IDENT.pattern} (letters, digits, . _ -)")
    return tenant


def check_pseudonym(user_id: Any) -> str:
    """``user_id`` if it is a pseudonym (what a record holds), else ConsentError."""
    if type(user_id) is not str or not PSEUDONYM.fullmatch(user_id):
        raise ConsentError(f"user {short(str(user_id))} is not a pseudonym (u_ + 32 hex digits): a consent record "
                           "never holds an app's user id in clear; pass it through pipelines/privacy/pseudonym.py "
                           "`pseudonym(cfg, tenant, user)` first")
    return user_id


def record_consent(cfg: Any, tenant: str, user_pseudonym: str, consent: bool, actor: str,
                   reason: str | None = None, at: datetime | None = None) -> ConsentRecord:
    """Append one consent record: ``user_pseudonym`` (the tenant's pseudonym of the user, never the
    app's id) of ``tenant`` opts in (``consent=True``) or out, from ``at`` (an aware datetime;
    default now) on. ``actor``: who records it (the CLI's OS user, the admin route's caller).
    ``reason``: optional; never the user's id or text in clear. The next selection of training
    and replay turns applies it. What the gateway's admin route calls (the CLI does too)."""
    tenant, user_pseudonym = _check_tenant(tenant), check_pseudonym(user_pseudonym)
    if type(consent) is not bool:
        raise ConsentError(f"consent must be true (opt in) or false (opt out), got {consent!r}")
    actor = _text(actor, "actor", MAX_ACTOR)
    reason = _text(reason, "reason", MAX_REASON, optional=True)
    now = datetime.now(timezone.utc)
    if at is None:
        at = now
    elif not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise ConsentError(f"at must be a datetime with a time zone, got {at!r}")
    rec = ConsentRecord(tenant, user_pseudonym, consent, at.astimezone(timezone.utc), now, actor, reason)
    table = pa.table({"user_id": [rec.user_id], "consent": [rec.consent], "effective_at": [rec.effective_at],
                      "recorded_at": [rec.recorded_at], "actor": [rec.actor], "reason": [rec.reason],
                      "tenant": [tenant]}, schema=CONSENT_SCHEMA.append(pa.field("tenant", pa.string())))
    delta.append(cfg.table_store, CONSENT, table,
                 info={"tracerl.run": f"consent-{tenant}-{'in' if consent else 'out'}", "tracerl.actor": actor})
    return rec


def consent_source(con: duckdb.DuckDBPyConnection, tables: delta.Where) -> str:
    """SQL relation on ``con`` of every consent record (tenant, user_id, consent, effective_at,
    recorded_at, actor, reason); an empty typed relation before the first one."""
    _, paths = delta.files(tables, CONSENT)
    if paths:
        return delta.scan(con, tables, CONSENT, paths, "_consent_table")
    return ("(SELECT NULL::VARCHAR AS tenant, NULL::VARCHAR AS user_id, NULL::BOOLEAN AS consent, "
            "NULL::TIMESTAMPTZ AS effective_at, NULL::TIMESTAMPTZ AS recorded_at, NULL::VARCHAR AS actor, "
            "NULL::VARCHAR AS reason WHERE false)")


def consented_sql(con: duckdb.DuckDBPyConnection, cfg: Any, tenant: str, turn: str = "t") -> str:
    """A SQL predicate over the turns view aliased ``turn`` (its ``tenant``, ``user_id`` and
    ``event_time``): true where the turn's user consented to training on it under ``tenant``'s
    policy (module docstring). Registers the view ``_consent`` on ``con`` (the records, one per
    tenant, user and instant: an opt-out wins a tie); for a query over ``tenant``'s turns."""
    pol = policy(cfg, _check_tenant(tenant))
    con.execute(f"CREATE OR REPLACE TEMP VIEW _consent AS SELECT tenant, user_id, effective_at, "
                f"bool_and(consent) AS consent FROM {consent_source(con, cfg.table_store)} GROUP BY ALL")
    who = f"c.tenant = {turn}.tenant AND c.user_id = {turn}.{USER_COLUMN}"
    at_the_time = (f"coalesce((SELECT arg_max(c.consent, c.effective_at) FROM _consent c WHERE {who} "
                   f"AND c.effective_at <= {turn}.event_time), {str(pol.default).lower()})")
    if not pol.retroactive:
        return at_the_time
    return (f"({at_the_time} AND NOT EXISTS (SELECT 1 FROM _consent c WHERE {who} AND NOT c.consent "
            f"AND c.effective_at > {turn}.event_time))")


def records(cfg: Any, tenant: str, user_pseudonym: str | None = None) -> list[ConsentRecord]:
    """``tenant``'s consent records (of one user), in the order they take effect."""
    tenant = _check_tenant(tenant)
    if user_pseudonym is not None:
        check_pseudonym(user_pseudonym)
    con = duckdb.connect()
    rows = con.execute(f"""
        SELECT tenant, user_id, consent, effective_at, recorded_at, actor, reason
        FROM {consent_source(con, cfg.table_store)}
        WHERE tenant = $tenant AND ($user IS NULL OR user_id = $user)
        ORDER BY effective_at, recorded_at, NOT consent""",
                       {"tenant": tenant, "user": user_pseudonym}).fetchall()
    return [ConsentRecord(r[0], r[1], r[2], r[3].astimezone(timezone.utc), r[4].astimezone(timezone.utc), r[5], r[6])
            for r in rows]


def latest(recs: list[ConsentRecord]) -> dict[str, ConsentRecord]:
    """Each user's record in force now (of `records`' output): the last to take effect by now."""
    now = datetime.now(timezone.utc)
    out: dict[str, ConsentRecord] = {}
    for r in recs:  # in effect order; an opt-out after an opt-in of the same instant
        if r.effective_at <= now:
            out[r.user_id] = r
    return out


def tenants_with_data(tables: delta.Where) -> set[str]:
    """Tenants with landed events or consent records (the tables' tenant partitions)."""
    out: set[str] = set()
    for dataset in (EVENTS, CONSENT):
        table = delta.open_table(tables, dataset)
        if table is not None:
            out |= {p["tenant"] for p in table.partitions() if p.get("tenant")}
    return out
