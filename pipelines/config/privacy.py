"""``[privacy]``: a tenant's end users' data rights (docs/privacy.md): PII redaction at the gateway,
training consent, retention, and what follows a forget. Per tenant (``[targets."<tenant>".privacy]``); a tenant/task entry may not set
it, since feedback and tool outcomes need not name their task."""

from __future__ import annotations

from typing import Literal

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION


@dataclass(config=SECTION)
class PrivacyConfig:
    """A tenant's privacy settings (``TracerlConfig.for_target(tenant).privacy``)."""

    redact_pii: bool = False  # e-mail addresses, phone, card and IBAN numbers -> [EMAIL], [PHONE], [CARD],
                              # [IBAN] in the recorded text (input messages, output text, feedback text,
                              # tool-call arguments and errors) before the event leaves the gateway; the
                              # user's answer is never changed (pipelines/privacy/redact.py)
    consent_default: bool = True  # a user with no consent record (and a turn with no user): true = trained on
                                  # until they opt out; false = never trained on until they opt in
                                  # (pipelines/lake/consent.py, `tracerl consent`)
    consent_retroactive: bool = False  # an opt-out also takes the user's turns from before it out of training
                                       # and replay (false: only their turns from the opt-out on)
    retention_days: int = 0  # raw traffic (events, quarantine rows, rewards, reference logprobs, the gateway's
                             # journal and spill segments, review tables) is deleted once this many whole UTC
                             # days have passed since the end of its day; 0 = kept (pipelines/rights/retention.py,
                             # `retention_daily`, `tracerl retention apply`)

    on_forget: Literal["retrain", "flag"] = "retrain"  # what `tracerl forget` does about the adapter versions
                                                       # trained on the user (docs/privacy.md#adapters-trained-on-a-user):
                                                       # retrain = the next candidate trains from the last
                                                       # ancestor not trained on them, and a tainted champion
                                                       # is replaced within retrain_deadline_hours; flag =
                                                       # mark and report only
    retrain_deadline_hours: float = 168.0  # under retrain: a champion trained on a forgotten user is rolled
                                           # back to its last clean ancestor (or the base model) this long
                                           # after the forget unless a clean champion was promoted by then

    def __post_init__(self) -> None:
        if not 0 <= self.retention_days <= 36_500:
            raise ValueError(f"privacy.retention_days={self.retention_days} must be in [0, 36500] days (0 = keep)")
        if not self.retrain_deadline_hours > 0:
            raise ValueError(f"privacy.retrain_deadline_hours={self.retrain_deadline_hours} must be > 0")
