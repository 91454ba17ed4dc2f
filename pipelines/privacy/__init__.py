"""Privacy at the door: end users as keyed pseudonyms (``pseudonym``), PII redacted from the
recorded text (``redact``), and the per-tenant settings the gateway applies (``policy``).

Below every stage and above ``pipelines.config`` in the import layers (pyproject.toml): the
gateway (``pipelines.deploy``) and ingest (``pipelines.ingest``) both use it. docs/privacy.md.
"""
