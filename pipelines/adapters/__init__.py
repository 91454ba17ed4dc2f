"""Adapters and what records them: the versioned store on disk (``store``: the files vLLM loads,
published atomically), the MLflow registry (``registry``: one model per tenant/task; ``promote``:
every move of the ``champion`` alias), and the one adapter-version parser (``version``).

The learner, the gate and the deployer all import it, so none of them imports another for it.
"""
