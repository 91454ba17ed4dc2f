"""Targets as Dagster partitions: one dynamic partition per tenant/task, key "tenant/task".

Every per-target asset (candidate_adapter, promotion, deployment) is partitioned by
`targets`, so each tenant/task has its own materialization history, metadata plots and
backfills in the UI, and a run of the loop is one target's iteration. "/" is a legal
partition-key character (Dagster refuses only "..." and control characters) and can never
be part of a tenant or task id (`check_id`: [A-Za-z0-9_.-]), so the key splits one way.
"""

from __future__ import annotations

import dagster as dg

from pipelines.adapters.store import check_id

TARGETS = "targets"
targets = dg.DynamicPartitionsDefinition(name=TARGETS)


def target_key(tenant: str, task: str) -> str:
    return f"{check_id(tenant, 'tenant')}/{check_id(task, 'task')}"


def parse_target(key: str) -> tuple[str, str]:
    """(tenant, task) of a partition key; a key not of the form tenant/task is an error naming it."""
    tenant, sep, task = str(key).partition("/")
    if not (sep and tenant and task):
        raise ValueError(f"target {key!r} is not of the form tenant/task (e.g. acme/concise)")
    return check_id(tenant, "tenant"), check_id(task, "task")


def materialize_target(assets: list, tenant: str, task: str, *, instance: dg.DagsterInstance | None = None,
                       **kw) -> dg.ExecuteInProcessResult:
    """`dg.materialize` of per-target assets for tenant/task (registering the partition first), on
    `instance` or a throwaway one: what tests and one-off runs use."""
    if instance is None:
        with dg.DagsterInstance.ephemeral() as tmp:
            return materialize_target(assets, tenant, task, instance=tmp, **kw)
    return dg.materialize(assets, partition_key=ensure_target(instance, tenant, task), instance=instance, **kw)


def ensure_target(instance: dg.DagsterInstance, tenant: str, task: str) -> str:
    """Register tenant/task as a partition (idempotent); returns its key."""
    key = target_key(tenant, task)
    if not instance.has_dynamic_partition(TARGETS, key):
        instance.add_dynamic_partitions(TARGETS, [key])
    return key


# Run tags the loop's assets set as they learn the iteration's outcome, so the runs page filters
# and reads by outcome ("tracerl/outcome:reject") without opening a run.
OUTCOME_TAG = "tracerl/outcome"      # promote | hold | reject | contaminated | error | no_candidate
CANDIDATE_TAG = "tracerl/candidate"  # the adapter version trained, "v7"
REASON_TAG = "tracerl/reason"        # why there is no candidate ("12 new settled turns < ...")


def tag_run(context: dg.AssetExecutionContext, tags: dict[str, str]) -> None:
    context.instance.add_run_tags(context.run.run_id, tags)
