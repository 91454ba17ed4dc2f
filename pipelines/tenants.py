"""Tenants as one operation: a key, a first champion, an eval suite (``tracerl tenant ...``).

A tenant/task needs three things before the loop can improve it, and this module makes them:

- an API key: ``<home>/gateway/keys/<tenant>.key`` (0600, shown once), which the running gateway
  picks up on its next request (``pipelines.deploy.keys``); deleting it (``revoke_tenant``)
  revokes it, also without a restart. A key in ``gateway.api_keys`` is used as it is.
- a serving champion: version 1, a fresh LoRA that serves the base model unchanged
  (``pipelines.loop.bootstrap.ensure_serving``), when the gateway runs; else later, with
  ``serve_tenant`` (``tracerl tenant serve``).
- an eval suite: ``<suites_dir>/<tenant>/<task>/`` copied from the template
  (``pipelines.evals.suites.template_dir``). Its items are placeholders, and the gate refuses to
  promote on them until they are replaced, so no candidate ships on an eval nobody wrote. A suite
  written there first (the eval before the tenant, as docs/guides.md suggests) is adopted as it is.

What exists is read from where each thing lives (key files and config, suite folders, the adapter
store, the gateway's routes, the registry's ``champion``), never from a separate tenant list.
Listing reads the embedded registry's SQLite file directly (``registry_versions``): importing
MLflow alone takes seconds, and ``tracerl tenant list`` and ``tracerl adapters`` answer in under one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.config import TracerlConfig


class TenantError(ValueError):
    """A tenant operation refused; the message says why and what to do."""


def check_name(value: str, what: str) -> str:
    """``value`` as a tenant or task id: the adapter store's check, and the trace contract's
    (64 characters at most: events name it)."""
    from pipelines.contract.validate import IDENT, short
    from pipelines.adapters.store import check_id

    check_id(value, what)
    if not IDENT.fullmatch(value):
        raise TenantError(f"{what}={short(value)} is longer than the 64 characters a trace event may name; use a shorter id")
    return value


def _suites_dir(cfg: TracerlConfig) -> Path:
    from pipelines.config import gate_config

    return Path(gate_config(cfg).suites_dir)


def _routes(cfg: TracerlConfig) -> dict[tuple[str, str], int]:
    from pipelines.deploy.routing import Router

    return {(r.tenant, r.task): r.version for r in Router(cfg.routes_path).routes()}


def _subdirs(folder: Path) -> list[str]:
    from pipelines.contract.validate import IDENT

    return sorted(p.name for p in folder.iterdir() if p.is_dir() and IDENT.fullmatch(p.name)) \
        if folder.is_dir() else []


def tasks_of(cfg: TracerlConfig, tenant: str) -> list[str]:
    """Every task tenant has anywhere: an eval suite folder, adapters, or a route."""
    found = set(_subdirs(_suites_dir(cfg) / tenant)) | set(_subdirs(cfg.adapter_root / tenant))
    found |= {k for (t, k) in _routes(cfg) if t == tenant}
    return sorted(found)


def _gateway_config(cfg: TracerlConfig):
    """``cfg.gateway`` (as ``pipelines.deploy.service.gateway_config``, without importing the gateway)."""
    from pipelines.config.gateway import GatewayConfig

    return getattr(cfg, "gateway", None) or GatewayConfig()


def _key_source(cfg: TracerlConfig, tenant: str) -> str | None:
    """"config", "file" or None: where tenant's key comes from."""
    from pipelines.deploy.keys import key_path

    if tenant in _gateway_config(cfg).api_keys:
        return "config"
    return "file" if key_path(cfg.home, tenant).is_file() else None


def _copy_template(template: Path, dest: Path) -> list[Path]:
    """The template's suite files (*.toml, *.jsonl) into ``dest``, which appears whole or not at all."""
    files = sorted(p for p in template.iterdir() if p.suffix in (".toml", ".jsonl"))
    if not any(p.suffix == ".toml" for p in files):
        raise TenantError(f"the eval template {template}/ holds no suite (*.toml); restore evals/_template/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for p in files:
            shutil.copy2(p, tmp / p.name)
        os.rename(tmp, dest)  # fails if dest appeared meanwhile: never merge into someone's suite
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [dest / p.name for p in files]


@dataclass
class Added:
    """What ``add_tenant`` did: the new key (None when the tenant had one), where things are."""

    tenant: str
    tasks: list[str]
    key_file: Path | None              # None: the key is configured (gateway.api_keys)
    key: str | None = None             # the new key, to show once; None if it existed
    suites: dict[str, Path] = field(default_factory=dict)   # task -> scaffolded folder
    adopted: dict[str, int] = field(default_factory=dict)   # task -> items of the suite written before
    served: dict[str, int] = field(default_factory=dict)    # task -> champion version now serving
    serve_note: str | None = None      # why nothing was served, and how to do it later
    serve_failed: bool = False         # serving was tried and failed (the key and suites exist)


def _written_suite(cfg: TracerlConfig, tenant: str, task: str) -> int | None:
    """The items of the suites someone wrote for tenant/task before adding the tenant, or None (no
    folder). A folder there that is not a valid suite is refused (``TenantError``, nothing changed):
    adopted, it would leave the gate nothing to decide on; scaffolding into it would merge files."""
    from pipelines.evals.suites import load_suites

    folder = _suites_dir(cfg) / tenant / task
    if not folder.exists():
        return None
    try:
        suites = load_suites(_suites_dir(cfg), tenant, task)
    except ValueError as err:
        raise TenantError(f"{folder}/ holds an eval suite that does not load ({err}); fix it, or move it away "
                          f"to scaffold one from the template; nothing was changed") from None
    if not suites:
        raise TenantError(f"{folder}/ exists but holds no suite (*.toml); write one there (see "
                          f"evals/_template/README.md) or remove the folder to scaffold one; nothing was changed")
    return sum(len(s.items) for s in suites)


def add_tenant(cfg: TracerlConfig, tenant: str, tasks: list[str], serve: bool = True) -> Added:
    """A key (if the tenant has none), an eval suite per task, and a serving champion per task
    when the gateway runs. A suite already written for a task is adopted as it is (``adopted``);
    refuses a task the tenant serves already (adapters or a route), before changing anything."""
    from pipelines.deploy.keys import key_path, write_key_file
    from pipelines.deploy.service import read_gateway_state
    from pipelines.evals.suites import template_dir

    check_name(tenant, "tenant")
    if not tasks:
        raise TenantError("name at least one task: tracerl tenant add NAME --task TASK")
    tasks = list(dict.fromkeys(check_name(t, "task") for t in tasks))
    served = set(_subdirs(cfg.adapter_root / tenant)) | {k for (t, k) in _routes(cfg) if t == tenant}
    clash = [t for t in tasks if t in served]
    source = _key_source(cfg, tenant)
    if clash:
        raise TenantError(f"tenant {tenant!r} already has task(s) {clash} (adapters or a route); nothing was "
                          f"changed. `tracerl tenant list` shows what it has")
    adopt = {t: n for t in tasks if (n := _written_suite(cfg, tenant, t)) is not None}
    template = template_dir(_suites_dir(cfg))
    if not template.is_dir():
        raise TenantError(f"no eval template at {template}/; restore evals/_template/ from tracerl")

    out = Added(tenant, tasks, None if source == "config" else key_path(cfg.home, tenant))
    out.adopted = adopt
    if source is None:
        key, created = write_key_file(out.key_file)
        out.key = key if created else None
    for task in tasks:
        if task in adopt:
            continue
        _copy_template(template, _suites_dir(cfg) / tenant / task)
        out.suites[task] = _suites_dir(cfg) / tenant / task
    if not serve:
        out.serve_note = f"not served (--no-serve); serve it with `tracerl tenant serve {tenant}`"
    elif read_gateway_state(cfg) is None:
        out.serve_note = (f"the gateway is not running; once the stack is up (`tracerl up`), serve the "
                          f"first champion (the base model) with `tracerl tenant serve {tenant}`")
    else:
        try:
            out.served = serve_tenant(cfg, tenant, tasks)
        except Exception as err:  # noqa: BLE001 - the key must still be shown: it exists now
            out.serve_failed = True
            out.serve_note = (f"serving the first champion failed ({type(err).__name__}: {err}); the key and "
                              f"suites exist: retry with `tracerl tenant serve {tenant}`")
    return out


def serve_tenant(cfg: TracerlConfig, tenant: str, tasks: list[str] | None = None) -> dict[str, int]:
    """Make the running gateway serve each task's champion (version 1, the base model, when there
    is none yet); {task: version}."""
    from pipelines.deploy.service import read_gateway_state
    from pipelines.loop.bootstrap import ensure_serving

    check_name(tenant, "tenant")
    tasks = [check_name(t, "task") for t in tasks] if tasks else tasks_of(cfg, tenant)
    if not tasks:
        raise TenantError(f"tenant {tenant!r} has no task; add one with `tracerl tenant add {tenant} --task TASK`")
    if read_gateway_state(cfg) is None:
        raise TenantError("the gateway is not running: start the stack with `tracerl up` (or `tracerl serve`)")
    return {task: ensure_serving(cfg, tenant, task) for task in tasks}


def revoke_tenant(cfg: TracerlConfig, tenant: str) -> Path:
    """Delete tenant's key file: the running gateway refuses the key from its next request on.
    Its suites, adapters and routes stay (add a key again with ``tracerl tenant add``)."""
    from pipelines.deploy.keys import delete_key_file, key_path

    check_name(tenant, "tenant")
    if _key_source(cfg, tenant) == "config":
        raise TenantError(f"tenant {tenant!r}'s key is configured (gateway.api_keys in tracerl.toml); "
                          "remove it there and restart the gateway")
    path = key_path(cfg.home, tenant)
    if not delete_key_file(path):
        raise TenantError(f"tenant {tenant!r} has no key file ({path}); nothing to revoke")
    return path


@dataclass
class TaskStatus:
    task: str
    champion: int | None      # adapter version behind the registry's champion alias
    serving: int | None       # adapter version the gateway's route serves
    items: int | None         # eval items over the task's suites; None: no suite
    placeholders: int = 0     # of which still the template's
    suite_error: str | None = None


@dataclass
class TenantStatus:
    tenant: str
    key: str | None           # "file", "config", or None (no key: cannot call the gateway)
    key_problem: str | None   # a key file the gateway skips, and why
    tasks: list[TaskStatus]


def _champions(cfg: TracerlConfig, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], int | None]:
    """The registry's champion per tenant/task (None: none)."""
    from pipelines.adapters.registry import CHAMPION

    versions = registry_versions(cfg, pairs)
    return {p: next((v.adapter_version for v in versions.get(p, []) if CHAMPION in v.aliases), None) for p in pairs}


@dataclass(frozen=True)
class RegistryVersion:
    """One model version as listings need it: what MLflow's ``ModelVersion`` says, read fast."""

    name: str
    version: str
    tags: dict[str, str]
    aliases: tuple[str, ...] = ()

    @property
    def adapter_version(self) -> int | None:
        from pipelines.adapters.version import tag_version

        try:
            return tag_version(self)
        except ValueError:
            return None


def registry_versions(cfg: TracerlConfig, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], list[RegistryVersion]]:
    """Every model version (tags, aliases) of each tenant/task, oldest first; a pair without a
    registered model maps to []. The embedded store (SQLite) is read directly, read-only, and not
    created when it does not exist (nothing was ever registered); another store (a server) through
    MLflow's client, as is a SQLite file whose schema is not the one expected."""
    import sqlite3

    pairs = list(dict.fromkeys(pairs))
    uri = cfg.tracking_uri
    if not pairs:
        return {}
    if uri.startswith("sqlite:///") and "?" not in uri:
        path = Path(uri[len("sqlite:///"):])
        if not path.is_file():
            return {p: [] for p in pairs}
        try:
            return _sqlite_versions(path, pairs)
        except sqlite3.Error:
            pass  # another MLflow schema: its client knows it
    return _client_versions(cfg, pairs)


def _sqlite_versions(path: Path, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], list[RegistryVersion]]:
    """``registry_versions`` from MLflow's SQLite tables (model_versions, model_version_tags,
    registered_model_aliases; workspace 'default' where the schema has workspaces)."""
    import sqlite3
    from urllib.parse import quote

    from pipelines.adapters.registry import model_name

    names = {model_name(t, k): (t, k) for t, k in pairs}
    con = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=10)
    try:
        spaced = "workspace" in {r[1] for r in con.execute("PRAGMA table_info(model_versions)")}
        ws = " AND {t}.workspace = 'default'" if spaced else ""
        marks = ",".join("?" * len(names))
        rows = con.execute(
            f"SELECT mv.name, mv.version, t.key, t.value FROM model_versions mv LEFT JOIN model_version_tags t "
            f"ON t.name = mv.name AND t.version = mv.version{ws.format(t='t')} WHERE mv.name IN ({marks}) "
            f"AND mv.current_stage != 'Deleted_Internal'{ws.format(t='mv')} ORDER BY mv.version",
            list(names)).fetchall()
        aliases = con.execute(f"SELECT a.name, a.version, a.alias FROM registered_model_aliases a "
                              f"WHERE a.name IN ({marks}){ws.format(t='a')}", list(names)).fetchall()
    finally:
        con.close()
    tags: dict[tuple[str, int], dict[str, str]] = {}
    for name, version, key, value in rows:
        got = tags.setdefault((name, int(version)), {})
        if key is not None:
            got[key] = value
    named: dict[tuple[str, int], list[str]] = {}
    for name, version, alias in aliases:
        named.setdefault((name, int(version)), []).append(alias)
    out: dict[tuple[str, str], list[RegistryVersion]] = {p: [] for p in pairs}
    for (name, version), t in sorted(tags.items()):
        out[names[name]].append(RegistryVersion(name, str(version), t, tuple(sorted(named.get((name, version), [])))))
    return out


def _client_versions(cfg: TracerlConfig, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], list[RegistryVersion]]:
    """``registry_versions`` through MLflow's client (any store it supports)."""
    from mlflow.exceptions import MlflowException

    from pipelines.adapters.registry import model_name
    from pipelines.tracking import client

    c, out = client(cfg), {}
    for t, k in pairs:
        name = model_name(t, k)
        try:
            versions = c.search_model_versions(f"name = '{name}'")
            aliases = c.get_registered_model(name).aliases or {}  # search results leave aliases out
        except MlflowException:
            out[(t, k)] = []
            continue
        named: dict[str, list[str]] = {}
        for alias, version in aliases.items():
            named.setdefault(str(version), []).append(alias)
        out[(t, k)] = sorted((RegistryVersion(name, str(mv.version), dict(mv.tags),
                                              tuple(sorted(named.get(str(mv.version), []))))
                              for mv in versions), key=lambda v: int(v.version))
    return out


def _tenants(cfg: TracerlConfig) -> tuple[set[str], dict[str, str], dict[str, str], dict[str, str]]:
    """(every tenant's name, the configured keys, the key files the gateway accepts, those it skips)."""
    from pipelines.contract.validate import IDENT
    from pipelines.deploy.keys import KeyRing, key_folder

    configured = _gateway_config(cfg).api_keys
    admin = cfg.home / "gateway" / "admin.key"  # reserved, as the gateway has it (never created here)
    reserved = tuple(k for k in (_gateway_config(cfg).admin_key, os.environ.get("TRACERL_GATEWAY_ADMIN_KEY"),
                                 admin.read_text().strip() if admin.is_file() else None) if k)
    ring = KeyRing(configured, key_folder(cfg.home), reserved=reserved)  # what the gateway accepts
    files, skipped = {t: "" for t in ring.tenants() if t not in configured}, ring.skipped
    names = set(files) | set(configured) | {s for n in skipped if IDENT.fullmatch(s := Path(n).stem)}
    names |= set(_subdirs(_suites_dir(cfg)))
    names |= set(_subdirs(cfg.adapter_root)) | {t for t, _ in _routes(cfg)}
    return names, configured, files, skipped


def tenant_names(cfg: TracerlConfig) -> set[str]:
    """The tenants ``list_tenants`` shows, by name only (no registry, no suites read)."""
    return _tenants(cfg)[0]


def list_tenants(cfg: TracerlConfig) -> list[TenantStatus]:
    """Every tenant: with a key (file or config), an eval suite folder, adapters or a route."""
    from pipelines.evals.suites import load_suites

    names, configured, files, skipped = _tenants(cfg)
    routes = _routes(cfg)
    tasks = {t: tasks_of(cfg, t) for t in sorted(names)}
    champions = _champions(cfg, [(t, k) for t, ks in tasks.items() for k in ks])
    out = []
    for tenant, ks in tasks.items():
        statuses = []
        for k in ks:
            items, held, error = None, 0, None
            try:
                suites = load_suites(_suites_dir(cfg), tenant, k)
                if suites:
                    items = sum(len(s.items) for s in suites)
                    held = sum(i.placeholder for s in suites for i in s.items)
            except ValueError as err:
                error = str(err)
            statuses.append(TaskStatus(k, champions.get((tenant, k)), routes.get((tenant, k)), items, held, error))
        key = "config" if tenant in configured else ("file" if tenant in files else None)
        out.append(TenantStatus(tenant, key, skipped.get(f"{tenant}.key"), statuses))
    return out
