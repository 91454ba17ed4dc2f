"""Deployment asset: the live gateway serves each tenant/task's registry champion.

Downstream of `candidate_adapter`, so the blocking `promotion_gate` check stands
between a candidate and this asset. It hot-swaps (load new, flip, drain, unload)
every route whose live version differs from the `champion` alias.
"""

import dagster as dg

from assets.resources import TracerlResource
from pipelines import registry
from pipelines.deploy.routing import Router
from pipelines.deploy.service import deploy, read_gateway_state
from pipelines.train.adapters import AdapterStore


@dg.asset(key="deployment", deps=["candidate_adapter"], group_name="deploy", kinds={"vllm"},
          description="The adapter version live in the gateway per tenant/task: the registry champion, "
                      "hot-swapped with zero failed requests.")
def deployment(context: dg.AssetExecutionContext, tracerl: TracerlResource) -> dg.MaterializeResult:
    cfg = tracerl.load()
    store = AdapterStore(cfg.adapter_root)
    router = Router(cfg.home / "deploy" / "routes.json")
    running = read_gateway_state(cfg) is not None
    swaps, pending = [], []
    targets = [(t.name, k.name) for t in sorted(cfg.adapter_root.glob("*")) if t.is_dir()
               for k in sorted(t.glob("*")) if k.is_dir()] if cfg.adapter_root.exists() else []
    for tenant, task in targets:
        want = registry.adapter_for_alias(cfg, tenant, task, registry.CHAMPION)
        live = router.live(tenant, task)
        if want is None or (live and live.version == want) or not store.list(tenant, task):
            continue
        if not running:
            pending.append(f"{tenant}/{task} v{want}")
            continue
        swaps.append(deploy(cfg, tenant, task, want, who="dagster"))
        context.log.info(f"{tenant}/{task}: now serving v{want} (was {live.version if live else 'base'})")
    return dg.MaterializeResult(metadata={
        "swaps": dg.MetadataValue.json(swaps), "swapped": len(swaps),
        "waiting_for_gateway": dg.MetadataValue.json(pending),
        "gateway": "running" if running else "not running (tracerl serve)",
    })


deploy_assets = [deployment]
