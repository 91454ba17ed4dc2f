"""What the CLI's listings print: tables a person reads at a terminal, all in one style.

``table`` is that style, for every listing (``tracerl tenant list``, ``adapters``, ``swaps``,
``consent show``): upper-case headers, columns two spaces apart, left-aligned, no rules or
borders, an empty cell as ``-``, one row per line (a grep finds a row whole). ``--json`` prints
the same rows as JSON lines, for scripts.

An adapter row says where a version stands, from the three places that know: the adapter store
(the files and their lineage), the registry (aliases and the gate's status tag; read without
importing MLflow: ``pipelines.tenants.registry_versions``) and the gateway's routes file (what
serves now, and a canary).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from pipelines.config import TracerlConfig

MARKS = ("live", "canary", "champion", "challenger")  # first in a row's marks, then the gate's status
GAP = "  "


def cell(v: Any) -> str:
    """A value as a table cell: None and "" as '-', on one line."""
    if v is None or v == "":
        return "-"
    return " ".join(str(v).split()) if isinstance(v, str) and ("\n" in v or "\t" in v) else str(v)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The listings' one style: ``headers`` (upper case) over ``rows``, columns two spaces apart."""
    heads = [h.upper() for h in headers]
    body = [[cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in [heads, *body]) for i in range(len(heads))]
    return "\n".join(GAP.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [heads, *body])


def clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


# -- tracerl tenant list ---------------------------------------------------------------------------

def format_tenants(tenants: list[Any]) -> str:
    """``pipelines.tenants.list_tenants`` as the table: one row per tenant/task."""
    from pipelines.adapters.version import label

    if not tenants:
        return "no tenants (add one: tracerl tenant add NAME --task TASK)"
    rows = []
    for t in tenants:
        key = t.key or ("skipped: " + t.key_problem if t.key_problem else "none")
        for k in t.tasks or [None]:
            suite = "-" if k is None else (f"invalid: {k.suite_error}" if k.suite_error else "none" if k.items is None
                                           else f"{k.items} items" + (f" ({k.placeholders} placeholders)"
                                                                      if k.placeholders else ""))
            rows.append((t.tenant, k.task if k else None, label(k.champion) if k and k.champion else None,
                         label(k.serving) if k and k.serving else None, key, suite))
    return table(["tenant", "task", "champion", "serving", "key", "eval suite"], rows)


# -- tracerl adapters ------------------------------------------------------------------------------

def adapter_rows(cfg: TracerlConfig, tenant: str | None = None, task: str | None = None) -> list[dict[str, Any]]:
    """Every adapter version of the matching targets, oldest first within a target."""
    from pipelines.adapters import promote
    from pipelines.adapters.store import FORGOTTEN, AdapterStore
    from pipelines.deploy.routing import Router
    from pipelines.tenants import registry_versions

    store = AdapterStore(cfg.adapter_root)
    router = Router(cfg.routes_path)
    targets = [(t, k) for t, k in store.targets()
               if (tenant is None or t == tenant) and (task is None or k == task)]
    registry = registry_versions(cfg, targets)
    rows = []
    for t, k in targets:
        reg = {v.adapter_version: v for v in registry.get((t, k), []) if v.adapter_version is not None}
        live = router.live(t, k)
        for v in store.list(t, k):
            m, r = v.meta, reg.get(v.version)
            marks = [x for x, on in (("live", live is not None and live.version == v.version),
                                     ("canary", live is not None and live.canary is not None
                                      and live.canary.version == v.version)) if on]
            marks += [a for a in (r.aliases if r else ()) if a in MARKS]
            status = r.tags.get(promote.STATUS, "") if r else ""
            if status and status not in marks:
                marks.append(status)
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
    return table(["target", "version", "parent", "turns", "created (UTC)", "marks", "mlflow run"],
                 [[f"{r['tenant']}/{r['task']}", f"v{r['version']}", f"v{r['parent']}" if r["parent"] else "base",
                   r["turns"], (r["created"] or "")[:19], " ".join(r["marks"]), (r["mlflow_run"] or "")[:12]]
                  for r in rows])


# -- tracerl swaps ---------------------------------------------------------------------------------

def swap_rows(cfg: TracerlConfig, tenant: str | None = None, task: str | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
    """Swap records of the matching targets, oldest first (the last ``limit``); as
    ``pipelines.deploy.service.swap_history`` reads them, without importing the gateway."""
    from pathlib import Path

    from pipelines.deploy.deployer import read_swaps

    rows = [s for s in read_swaps(Path(cfg.home) / "deploy" / "swaps.jsonl")
            if (tenant is None or s.get("tenant") == tenant) and (task is None or s.get("task") == task)]
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
        out.append([str(s.get("at", ""))[:19], f"{s.get('tenant')}/{s.get('task')}", s.get("action"), moved,
                    "ok" if s.get("ok", True) else "FAILED", s.get("requests"), s.get("failed_requests"),
                    s.get("who"), clip(why, 80)])
    return table(["at (UTC)", "target", "action", "from -> to", "outcome", "requests", "failed", "who",
                  "why / error"], out)


# -- tracerl consent show --------------------------------------------------------------------------

def format_consent(records: list[Any]) -> str:
    """Consent records (``pipelines.lake.consent``) as the table."""
    return table(["user", "consent", "effective", "by", "recorded", "reason"],
                 [(r.user_id, "opt-in" if r.consent else "opt-out", r.to_dict()["effective_at"], r.actor,
                   r.to_dict()["recorded_at"], r.reason) for r in records])


def json_lines(rows: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(r, default=str) for r in rows)
