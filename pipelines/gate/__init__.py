"""The promotion gate: private eval suites, paired statistics, the MLflow registry as review desk."""
