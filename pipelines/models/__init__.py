"""Base models for tracerl: resolve a spec to a local HF folder, build the offline ones.

Kept import-light (no torch/transformers at import time): ``tracerl --help`` and the Dagster
code location import this package; the heavy libraries load inside the functions that build.
"""

from pipelines.models.registry import base_model_hash, resolve_base_model

__all__ = ["base_model_hash", "resolve_base_model"]
