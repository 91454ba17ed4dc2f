"""The MLflow model registry as the review desk: one registered model per tenant/task.

Each candidate adapter is a model version (source = the learner run's `adapter`
artifact), tagged with its lineage. Aliases (`champion`, `challenger`) say what is
live and what is under review; stages are deprecated and unused. The adapter
store (`pipelines/adapters/store.py`) holds the files that vLLM loads; the
version tag `adapter_version` links the two.
"""

from __future__ import annotations

import re
from typing import Any

from pipelines.adapters.version import tag_version
from pipelines.config import TracerlConfig
from pipelines.tracking import client

CHAMPION = "champion"
CHALLENGER = "challenger"
# version tag: the forget requests (comma-separated ids) of users this version trained on, itself or
# through an ancestor (pipelines/rights/forget.py; the adapter store's mark `store.FORGOTTEN` says the same)
FORGOTTEN_TAG = "tracerl.trained_on_forgotten_user"
# the version tags a registration keeps: what people search the registry by (tags.`<key>` = '...')
# and what code reads; the learner's numbers are its run's metrics and the description's "Learner"
# section. The gate adds its few (pipelines/gate/review.py GATE_TAGS), alias moves theirs (promote.py).
VERSION_TAGS = ("tenant", "task", "adapter_version", "parent_version", "base_model", "base_model_hash",
                "reward_spec_version", "tracerl.branch.base", "tracerl.branch.depth", "tracerl.branch.parent",
                "tracerl.branch.reset_reason",
                "tracerl.deliberately_bad")  # the canary demo's made-worse versions (pipelines/loop/backwards.py)


def model_name(tenant: str, task: str) -> str:
    return f"{tenant}.{task}"


def register_candidate(cfg: TracerlConfig, tenant: str, task: str, run_id: str, adapter_version: int,
                       tags: dict[str, Any]) -> str:
    """Register the run's adapter artifact as a new model version; returns the version number.
    Of ``tags``, only ``VERSION_TAGS`` go on the version (the run keeps the rest)."""
    from mlflow.exceptions import MlflowException

    c = client(cfg)
    name = model_name(tenant, task)
    try:
        c.create_registered_model(name, tags={"tenant": tenant, "task": task},
                                  description=f"LoRA adapters for tenant {tenant}, task {task}, trained by tracerl.")
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
            raise
    mv = c.create_model_version(name, source=f"runs:/{run_id}/adapter", run_id=run_id,
                                tags={"adapter_version": str(adapter_version),
                                      **{k: str(v) for k, v in tags.items() if k in VERSION_TAGS}})
    return mv.version


def adapter_for_alias(cfg: TracerlConfig, tenant: str, task: str, alias: str = CHAMPION) -> int | None:
    """The adapter-store version behind a registry alias, or None (no model or no alias yet)."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client(cfg).get_model_version_by_alias(model_name(tenant, task), alias)
    except MlflowException:
        return None
    return tag_version(mv)


def set_alias(cfg: TracerlConfig, tenant: str, task: str, alias: str, registry_version: str) -> None:
    client(cfg).set_registered_model_alias(model_name(tenant, task), alias, registry_version)


def describe(cfg: TracerlConfig, tenant: str, task: str, registry_version: str, heading: str, body: str) -> str:
    """Write ``body`` as the ``## heading`` section of the model version's description (Markdown,
    what the registry's version page shows first): a section of that heading is replaced, others
    (the learner's, the gate's, the canary's) are kept in order. Returns the new description."""
    c, name = client(cfg), model_name(tenant, task)
    old = c.get_model_version(name, str(registry_version)).description or ""
    sections = {part.split("\n", 1)[0]: part.rstrip() for part in re.split(r"(?m)^(?=## )", old) if part.strip()}
    sections[f"## {heading}"] = f"## {heading}\n\n{body.strip()}"  # an existing key keeps its place
    text = "\n\n".join(sections.values()) + "\n"
    c.update_model_version(name, str(registry_version), description=text[:20000])
    return text


def run_link(cfg: TracerlConfig, run_id: str, label: str) -> str:
    """A Markdown link to a run, relative to the MLflow UI the registry page is served from."""
    from pipelines.tracking import run_path

    r = client(cfg).get_run(run_id)
    return f"[{label}]({run_path(r.info.experiment_id, run_id)})"


def version_link(tenant: str, task: str, registry_version: str, label: str) -> str:
    """A Markdown link to a model version's page, relative to the MLflow UI (for run descriptions)."""
    return f"[{label}](#/models/{model_name(tenant, task)}/versions/{registry_version})"


def version_for_adapter(cfg: TracerlConfig, tenant: str, task: str, adapter_version: int) -> Any | None:
    """The registry model version registered for adapter-store version ``adapter_version`` (its
    ``adapter_version`` tag), or None (not registered, or no registered model yet)."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client(cfg).search_model_versions(f"name = '{model_name(tenant, task)}'")
    except MlflowException:
        return None
    hits = [mv for mv in versions if "adapter_version" in mv.tags and tag_version(mv) == int(adapter_version)]
    return max(hits, key=lambda mv: int(mv.version)) if hits else None
