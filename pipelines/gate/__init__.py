"""The promotion gate: samples candidate and champion on the private evals (``pipelines.evals``),
compares them with paired statistics, and records the decision in the MLflow registry through
``pipelines.adapters.promote`` (the one place the ``champion`` alias moves)."""
