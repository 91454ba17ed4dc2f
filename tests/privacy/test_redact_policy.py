"""``privacy.redact_pii`` is a tenant's setting (``[targets."<tenant>".privacy]``, or global), never a
task's; the gateway's policy object reads it per tenant and redacts only that tenant's events."""

from __future__ import annotations

import pytest

from pipelines.config import ConfigError, TracerlConfig
from pipelines.privacy.policy import Privacy


def test_redaction_is_on_for_the_tenants_that_ask_for_it(tmp_path):
    cfg = TracerlConfig.from_dict({"home": str(tmp_path), "targets": {"globex": {"privacy": {"redact_pii": True}}}})
    policy = Privacy(cfg)
    assert policy.redacts("globex") and not policy.redacts("acme")
    event = {"type": "feedback", "tenant": "globex", "text": "mail a@b.cd"}
    assert policy.apply(event) == {"email": 1} and event["text"] == "mail [EMAIL]"
    other = {"type": "feedback", "tenant": "acme", "text": "mail a@b.cd"}
    assert policy.apply(other) == {} and other["text"] == "mail a@b.cd"
    assert policy.counts == {"email": 1}
    everyone = Privacy(TracerlConfig.from_dict({"home": str(tmp_path), "privacy": {"redact_pii": True},
                                                "targets": {"acme": {"privacy": {"redact_pii": False}}}}))
    assert everyone.redacts("globex") and not everyone.redacts("acme")
    assert policy.pseudonym("acme", "alice") == everyone.pseudonym("acme", "alice")  # one secret per home


def test_a_task_entry_may_not_set_it():
    with pytest.raises(ConfigError, match=r'targets."acme/support": privacy is set per tenant, not per task'):
        TracerlConfig.from_dict({"targets": {"acme/support": {"privacy": {"redact_pii": True}}}})
    with pytest.raises(ConfigError, match="privacy.redact_pii = 'yes': expected bool"):
        TracerlConfig.from_dict({"targets": {"acme": {"privacy": {"redact_pii": "yes"}}}})
