"""tracerl's command line: the top layer. It may import the Dagster wiring (``assets``) and every
stage (``pipelines``); nothing imports it (see pyproject ``[tool.importlinter]``)."""
