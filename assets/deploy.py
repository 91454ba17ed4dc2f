"""Deployment asset: the live gateway serves each tenant/task's registry champion.

Downstream of `promotion`, whose blocking `no_contamination` check stands between a candidate and
this asset. It hot-swaps (load new, flip, drain, unload) every route whose live version differs
from the `champion` alias; after a rejection the champion is unchanged and nothing swaps. The
hourly `closed_loop_hourly` schedule also runs it alone, to serve champions moved by approvals
and swaps that waited for the gateway.
"""

from datetime import timedelta

import dagster as dg

from assets.resources import TargetsConfig, TracerlResource
from pipelines import registry
from pipelines.deploy.routing import Router
from pipelines.deploy.service import GatewayError, deploy, read_gateway_state
from pipelines.train.adapters import AdapterStore


class DeployRunConfig(TargetsConfig):
    """targets: "tenant/task" to sync; empty: every tenant/task in the adapter store."""


def _served(router: Router, tenant: str, task: str) -> str:
    live = router.live(tenant, task)
    return f"v{live.version}" if live else "base"


@dg.asset(key="deployment", deps=["promotion"], group_name="deploy", kinds={"vllm"},
          description="The adapter version live in the gateway per tenant/task: the registry champion, "
                      "hot-swapped with zero failed requests.",
          # Materialized by every loop run that gated a candidate, and at least hourly by the
          # closed_loop_hourly schedule: two missed hours warn, four fail.
          freshness_policy=dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=4),
                                                          warn_window=timedelta(hours=2)))
def deployment(context: dg.AssetExecutionContext, config: DeployRunConfig,
               tracerl: TracerlResource) -> dg.MaterializeResult:
    cfg = tracerl.load()
    store = AdapterStore(cfg.adapter_root)
    routes = cfg.home / "deploy" / "routes.json"
    router = Router(routes)
    running = read_gateway_state(cfg) is not None
    swaps, pending, failed, champions = [], [], [], {}
    targets = config.pairs() or ([(t.name, k.name) for t in sorted(cfg.adapter_root.glob("*")) if t.is_dir()
                                  for k in sorted(t.glob("*")) if k.is_dir()] if cfg.adapter_root.exists() else [])
    before = {f"{tenant}/{task}": _served(router, tenant, task) for tenant, task in targets}
    for tenant, task in targets:
        want = registry.adapter_for_alias(cfg, tenant, task, registry.CHAMPION)
        champions[f"{tenant}/{task}"] = f"v{want}" if want is not None else None
        live = router.live(tenant, task)
        if want is None or (live and live.version == want) or not store.list(tenant, task):
            continue
        if not running:
            pending.append(f"{tenant}/{task} v{want}")
            continue
        try:
            swaps.append(deploy(cfg, tenant, task, want, who="dagster"))
        except GatewayError as e:  # the old version keeps serving; try the other routes
            failed.append({"tenant": tenant, "task": task, "to": f"v{want}", "error": str(e)})
            context.log.error(f"{tenant}/{task}: swap to v{want} failed, {before[f'{tenant}/{task}']} "
                              f"keeps serving: {e}")
            continue
        context.log.info(f"{tenant}/{task}: now serving v{want} (was {before[f'{tenant}/{task}']})")
    after_router = Router(routes)  # the gateway wrote the flips to routes.json
    after = {f"{tenant}/{task}": _served(after_router, tenant, task) for tenant, task in targets}
    metadata = {
        "swapped": len(swaps),
        "failed_swaps": len(failed),
        "versions_before": dg.MetadataValue.json(before),
        "versions_after": dg.MetadataValue.json(after),
        "champions": dg.MetadataValue.json(champions),
        "swaps": dg.MetadataValue.json(swaps),
        "drain_seconds_max": max((s.get("drain_s") or 0.0 for s in swaps), default=0.0),
        "undrained": sum(s.get("drained") is False for s in swaps),
        # live requests that ended during the swaps, and those vLLM failed (the router's count)
        "requests_during_swaps": sum(s.get("requests") or 0 for s in swaps),
        "failed_requests_during_swaps": sum(s.get("failed_requests") or 0 for s in swaps),
        "failed": dg.MetadataValue.json(failed),
        "waiting_for_gateway": dg.MetadataValue.json(pending),
        "gateway": "running" if running else "not running (tracerl serve)",
    }
    if failed:
        raise dg.Failure(description=f"{len(failed)} swap(s) failed; those routes keep their old version: "
                                     + "; ".join(f"{f['tenant']}/{f['task']} {f['to']}: {f['error']}" for f in failed),
                         metadata=metadata)
    return dg.MaterializeResult(metadata=metadata)


deploy_assets = [deployment]
