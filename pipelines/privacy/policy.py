"""A deployment's privacy settings per tenant, as the gateway applies them to every event it emits:
the user's pseudonym (``pseudonym.py``) and, where the tenant's ``privacy.redact_pii`` says so,
PII redacted from the recorded text (``redact.py``). One instance per gateway; lookups cached."""

from __future__ import annotations

from typing import Any

from pipelines.config.tracerl import TracerlConfig
from pipelines.privacy.pseudonym import pseudonym
from pipelines.privacy.redact import redact_event


class Privacy:
    def __init__(self, cfg: TracerlConfig):
        self.cfg = cfg
        self._redacts: dict[str, bool] = {}
        self.counts: dict[str, int] = {}  # placeholders put in, per kind (the gateway's /admin/stats)

    def redacts(self, tenant: str) -> bool:
        """``privacy.redact_pii`` of the tenant (its ``targets`` entry over the global setting)."""
        found = self._redacts.get(tenant)
        if found is None:
            found = self._redacts[tenant] = bool(self.cfg.for_target(tenant).privacy.redact_pii)
        return found

    def pseudonym(self, tenant: str, user: str) -> str:
        """The tenant's pseudonym of an app's user id (its secret under the home, made on first use)."""
        return pseudonym(self.cfg, tenant, user)

    def apply(self, event: dict[str, Any]) -> dict[str, int]:
        """Redact PII in ``event`` (wire form) in place if its tenant asks for it; what was found
        (kind -> placeholders put in; empty: nothing, or the tenant does not redact)."""
        if not self.redacts(event["tenant"]):
            return {}
        found = redact_event(event)
        for kind, n in found.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        return found
