"""Data rights over every store tracerl keeps traffic in: retention (``retention.py``: raw traffic
leaves after a tenant's period), forget (``forget.py``: `tracerl forget`, one user's data out of
every store, the adapters trained on them marked; ``forget_deadline.py``: the retrain policy's
deadline on a marked champion). docs/privacy.md.

A layer of its own, above the gate (pyproject.toml's import layers): it reaches the lake's tables,
the gateway's journal and spill (``pipelines.deploy``) and the gate's review tables in MLflow
(``pipelines.gate``), which ``pipelines.privacy`` (below the lake, used by the gateway and ingest)
may not import.
"""
