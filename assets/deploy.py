"""Deployment asset: the live gateway serves each tenant/task's registry champion.

Partitioned by target (tenant/task) like the rest of the loop; downstream of `promotion`, whose
blocking `no_contamination` check stands between a candidate and this asset. It runs `reconcile` (pipelines/deploy/reconcile.py): every route whose live version
differs from the `champion` alias is hot-swapped (load new, flip, drain, unload); routes in sync
are left alone, so a run after an operator's rollback changes nothing. The hourly
`closed_loop_hourly` schedule also runs it alone, to serve champions moved by approvals and
swaps that waited for the gateway.
"""

from datetime import timedelta

import dagster as dg

from assets.resources import GatewayResource, MlflowResource
from assets.targets import parse_target, targets
from pipelines.adapters.version import label
from pipelines.deploy.reconcile import ReconcileReport, reconcile


def report_metadata(report: ReconcileReport) -> dict:
    """The report as asset metadata (one JSON value per view of it, counts as numbers)."""
    swaps = [t.swap or {} for t in report.of("swapped")]
    return {
        "swapped": len(swaps),
        "failed_swaps": len(report.of("failed")),
        "versions_before": dg.MetadataValue.json({t.key: label(t.before) for t in report.targets}),
        "versions_after": dg.MetadataValue.json({t.key: label(t.after) for t in report.targets}),
        "champions": dg.MetadataValue.json({t.key: None if t.champion is None else label(t.champion)
                                            for t in report.targets}),
        "swaps": dg.MetadataValue.json(swaps),
        "drain_seconds_max": max((s.get("drain_s") or 0.0 for s in swaps), default=0.0),
        "undrained": sum(s.get("drained") is False for s in swaps),
        # live requests that ended during the swaps, and those vLLM failed (the router's count)
        "requests_during_swaps": sum(s.get("requests") or 0 for s in swaps),
        "failed_requests_during_swaps": sum(s.get("failed_requests") or 0 for s in swaps),
        "failed": dg.MetadataValue.json([{"tenant": t.tenant, "task": t.task, "to": label(t.champion), "error": t.reason}
                                         for t in report.of("failed")]),
        "waiting_for_gateway": dg.MetadataValue.json([f"{t.key} {label(t.champion)}" for t in report.of("waiting")]),
        "report": dg.MetadataValue.md("\n".join(f"- {line}" for line in report.lines()) or "no tenant/task"),
    }


@dg.asset(key="deployment", deps=["promotion"], partitions_def=targets, group_name="deploy", kinds={"vllm"},
          description="The adapter version live in the gateway for the tenant/task: the registry champion, "
                      "hot-swapped with zero failed requests when the gate (or an operator) moved it.",
          # Materialized by every loop run that gated a candidate, and at least hourly by the
          # closed_loop_hourly schedule: two missed hours warn, four fail.
          freshness_policy=dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=4),
                                                          warn_window=timedelta(hours=2)))
def deployment(context: dg.AssetExecutionContext, mlflow: MlflowResource,
               gateway: GatewayResource) -> dg.MaterializeResult:
    tenant, task = parse_target(context.partition_key)
    # to the registry's champion; the swap log says which run swapped, and why (the champion's reason)
    report = gateway.reconcile([(tenant, task)], who=f"dagster run {context.run_id}")
    for t in report.targets:
        (context.log.error if t.outcome == "failed" else context.log.info)(t.line())
    metadata = report_metadata(report)
    metadata["gateway"] = gateway.health()
    champion = mlflow.champion(tenant, task)
    if champion is not None:
        metadata["model_version"] = mlflow.model_version_url(tenant, task, champion["registry_version"])
    failed = report.of("failed")
    if failed:
        raise dg.Failure(description=f"{len(failed)} swap(s) failed; those routes keep their old version: "
                                     + "; ".join(t.line() for t in failed), metadata=metadata)
    return dg.MaterializeResult(metadata=metadata)


deploy_assets = [deployment]
