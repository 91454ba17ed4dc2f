"""What `tracerl adapters` and `tracerl swaps` print: tables a person reads at a terminal.

Each row says where a version stands, from the three places that know: the adapter store (the
files and their lineage), the registry (aliases and the gate's status tag) and the gateway's
routes file (what serves now, and a canary). `--json` prints the same rows as JSON lines, for
scripts.
"""

from __future__ import annotations

import json
from typing import Any

from tabulate import tabulate

from pipelines.config import TracerlConfig

MARKS = ("live", "canary", "champion", "challenger")  # first in a row's marks, then the gate's status


def _registry(cfg: TracerlConfig, tenant: str, task: str) -> dict[int, dict[str, Any]]:
    """adapter version -> {"aliases": [...], "status": str}, from the registry (empty when none)."""
    from mlflow.exceptions import MlflowException

    from pipelines.adapters import promote
    from pipelines.adapters.registry import model_name
    from pipelines.adapters.version import tag_version
    from pipelines.tracking import client

    c, name = client(cfg), model_name(tenant, task)
    try:
        versions = c.search_model_versions(f"name = '{name}'")
        aliases = c.get_registered_model(name).aliases  # search results leave aliases out
    except MlflowException:
        return {}
    by_version: dict[str, list[str]] = {}
    for alias, version in (aliases or {}).items():
        by_version.setdefault(str(version), []).append(alias)
    return {tag_version(mv): {"aliases": sorted(by_version.get(str(mv.version), [])),
                              "status": mv.tags.get(promote.STATUS, "")}
            for mv in versions if "adapter_version" in mv.tags}


def adapter_rows(cfg: TracerlConfig, tenant: str | None = None, task: str | None = None) -> list[dict[str, Any]]:
    """Every adapter version of the matching targets, oldest first within a target."""
    from pipelines.adapters.store import FORGOTTEN, AdapterStore
    from pipelines.deploy.routing import Router

    store = AdapterStore(cfg.adapter_root)
    router = Router(cfg.routes_path)
    rows = []
    for t, k in store.targets():
        if (tenant is not None and t != tenant) or (task is not None and k != task):
            continue
        reg, live = _registry(cfg, t, k), router.live(t, k)
        for v in store.list(t, k):
            m, r = v.meta, reg.get(v.version, {})
            marks = [x for x, on in (("live", live is not None and live.version == v.version),
                                     ("canary", live is not None and live.canary is not None
                                      and live.canary.version == v.version)) if on]
            marks += [a for a in r.get("aliases", []) if a in MARKS]
            if r.get("status") and r["status"] not in marks:
                marks.append(r["status"])
            forgotten = sorted(((m.get("marks") or {}).get(FORGOTTEN) or {}))
            if forgotten:  # trained on a user forgotten since (`tracerl forget`; docs/privacy.md)
                marks.append(f"trained_on_forgotten_user({','.join(forgotten)})")
            rows.append({"tenant": t, "task": k, "version": v.version, "parent": m.get("parent_version"),
                         "turns": (m.get("data_window") or {}).get("turns"), "created": m.get("created_at"),
                         "marks": marks, "mlflow_run": m.get("mlflow_run_id")})
    return rows


def format_adapters(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no adapter versions"
    return tabulate([[f"{r['tenant']}/{r['task']}", f"v{r['version']}",
                      f"v{r['parent']}" if r["parent"] else "base", "-" if r["turns"] is None else r["turns"],
                      (r["created"] or "")[:19], " ".join(r["marks"]), (r["mlflow_run"] or "")[:12]]
                     for r in rows], headers=["target", "version", "parent", "turns", "created (UTC)", "marks",
                                              "mlflow run"])


def swap_rows(cfg: TracerlConfig, tenant: str | None = None, task: str | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
    """Swap records of the matching targets, oldest first (the last ``limit``)."""
    from pipelines.deploy.service import swap_history

    rows = [s for s in swap_history(cfg) if (tenant is None or s.get("tenant") == tenant)
            and (task is None or s.get("task") == task)]
    return rows[-limit:] if limit else rows


def _fmt(v: Any) -> str:
    return "" if v is None else f"v{v}" if isinstance(v, int) else str(v)


def format_swaps(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no swaps"
    out = []
    for s in rows:
        moved = f"{_fmt(s.get('from')) or '-'} -> {_fmt(s.get('to')) or '-'}"
        why = s.get("error") or s.get("why") or ""
        out.append([str(s.get("at", ""))[:19], f"{s.get('tenant')}/{s.get('task')}", s.get("action", ""), moved,
                    "ok" if s.get("ok", True) else "FAILED", s.get("requests", ""), s.get("failed_requests", ""),
                    s.get("who", ""), why if len(why) <= 60 else why[:57] + "..."])
    return tabulate(out, headers=["at (UTC)", "target", "action", "from -> to", "outcome", "requests", "failed",
                                  "who", "why / error"])


def json_lines(rows: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(r, default=str) for r in rows)
