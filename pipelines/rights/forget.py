"""Forget one end user of a tenant: ``forget(cfg, tenant, raw_user, actor) -> Receipt``.

Steps (docs/privacy.md#forget), each idempotent, state in the durable request
(`pipelines/privacy/forget_requests.py`) so a rerun after a crash at any point resumes:

1. find: the user's pseudonym; every event of the tenant naming it, and the events without a user
   of their traces and turns (feedback, tool calls, session ends sent without `user`); their turn,
   trace and event ids; SHA-256 of their prompts (for the review tables); per store, the rows and
   the data files that hold them. Written to the request (ids only) before anything is deleted.
   A rerun adds what it finds now to what the request holds.
2. mark: the adapter versions the learner's ledger credits with any of those turns, and every
   version descending from one, get the store mark ``trained_on_forgotten_user`` and the registry
   tag ``tracerl.trained_on_forgotten_user`` (the request id), with the tenant's policy.
3. delete: Delta deletes of the rows in every lake table holding them (events, quarantine rows
   whose raw bytes name the user or their ids, rewards, reward corrections, the reward stage's open
   state, the ledger's rows of those turns (after the marks), reference logprobs); then the data
   files the deletes removed are deleted at once, a checkpoint is written and the log entries before
   it removed (their file statistics quote column values): Delta time travel to a version before
   the forget ends here. Then the SQLite caches (judge verdicts, reward-model features: rows
   deleted, the file VACUUMed and its WAL truncated), the gateways' journal and spill segments
   (rewritten without the user's events; a segment a live gateway is still appending to is left
   for its next sweep and reported), the review desk's side-by-side tables in MLflow's artifacts.
4. receipt: counts per store, times, who asked, versions marked, the policy and deadline; no
   content. Appended to ``<home>/privacy/forget/receipts.jsonl``.

Held for the whole forget: the tenant's forget lock and every learner lock of the tenant
(`pipelines/train/run.py` ``learner_lock``), taken without waiting: a learner running refuses the
forget (`ForgetRefused`), so no learner trains on turns being deleted nor writes ledger rows of them.
"""

from __future__ import annotations

import fcntl
import getpass
import hashlib
import json
import os
import sqlite3
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Iterator

from pipelines.config import TracerlConfig
from pipelines.contract.validate import IDENT
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS, QUARANTINE, REFERENCE, TRAINED_TURNS
from pipelines.lake.tables import CORRECTIONS, PENDING, PROVISIONAL, REWARDS
from pipelines.privacy import forget_requests as fr
from pipelines.privacy.pseudonym import pseudonym

# lake tables holding per-turn rows, keyed by tenant + turn/trace ids (`consent` is kept: the
# user's own instruction, a pseudonym and a flag, no content; `reward_runs` holds file names only)
TURN_TABLES = (REWARDS, CORRECTIONS, PROVISIONAL, PENDING, TRAINED_TURNS, REFERENCE)
TRACE_TABLES = (REWARDS, CORRECTIONS, PROVISIONAL, PENDING)  # those with a trace_id column
SIDE_BY_SIDE = "side_by_side.json"  # the gate's review table (pipelines/gate/run.py), under artifacts/gate/
PROMPT_CHARS = 2000  # pipelines/gate/side_by_side.py MAX_CHARS: the table's prompt cell


class ForgetError(ValueError):
    """Bad input (an unknown tenant, an empty user id): nothing was done."""


class ForgetRefused(RuntimeError):
    """Not now (a learner of the tenant runs, another forget of it runs): nothing was done; retry."""


@dataclass
class Receipt:
    id: str
    tenant: str
    user: str                          # the pseudonym (never the id in clear)
    actor: str
    requested_at: str
    completed_at: str = ""
    status: str = "done"               # done | no_data
    policy: str = "retrain"
    deadline: str | None = None        # under retrain with a marked champion: when it is replaced at the latest
    counts: dict[str, int] = field(default_factory=dict)
    versions_marked: list[dict[str, Any]] = field(default_factory=list)
    left: dict[str, int] = field(default_factory=dict)  # what could not be done now (open gateway segments)
    repeat: bool = False               # a forget of a user already forgotten (counts: what was found now)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        out = [f"forget {self.id}: tenant {self.tenant}, user {self.user}, asked by {self.actor} at {self.requested_at}"]
        if self.status == "no_data":
            out.append("  no data of this user in this tenant: nothing deleted, nothing marked")
            return out
        out.append(f"  completed {self.completed_at}{' (again: already forgotten before)' if self.repeat else ''}")
        for store, n in sorted(self.counts.items()):
            out.append(f"  {store:28s} {n}")
        for k, n in sorted(self.left.items()):
            out.append(f"  left for now: {k} {n} (rerun `tracerl forget` once the gateway has swept it)")
        if self.versions_marked:
            vs = ", ".join(f"{v['task']}/v{v['version']}" + ("" if v["direct"] else " (inherited)")
                           for v in self.versions_marked)
            out.append(f"  adapter versions trained on the user (marked): {vs}")
        else:
            out.append("  adapter versions trained on the user: none")
        out.append(f"  policy: {self.policy}" + (f"; a champion trained on the user is replaced by {self.deadline}"
                                                 if self.deadline else ""))
        return out


def default_actor() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in a container
        return str(os.getuid())


# -- locks --------------------------------------------------------------------------------------

@contextmanager
def _try_lock(path: Path, what: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ForgetRefused(f"{what} is running; nothing was done: run the forget again when it is finished") \
                from None
        yield
    finally:
        fh.close()


@contextmanager
def _exclusive(cfg: TracerlConfig, tenant: str) -> Iterator[None]:
    from pipelines.train.run import learner_lock

    with ExitStack() as stack:
        stack.enter_context(_try_lock(fr.forget_dir(cfg.home) / tenant / ".lock", f"another forget of {tenant}"))
        folder = learner_lock(cfg, tenant, "x").parent
        for lock in sorted(folder.glob("*.lock")) if folder.is_dir() else []:
            stack.enter_context(_try_lock(lock, f"a learner of {tenant}/{lock.stem}"))
        yield


# -- finding --------------------------------------------------------------------------------------

def _q(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _in(column: str, values: list[str]) -> str:
    return f"{column} IN ({', '.join(_q(v) for v in values)})" if values else "false"


def _events_of(cfg: TracerlConfig, tenant: str, user: str) -> list[tuple]:
    """(event_id, type, trace_id, turn_id, payload) of the user's events and of their traces'/turns' events with no user."""
    import duckdb

    _, paths = delta.files(cfg.table_store, EVENTS, where=[("tenant", "=", tenant)])
    if not paths:
        return []
    con = duckdb.connect()
    rel = delta.scan(con, cfg.table_store, EVENTS, paths, "_ev")
    cols = {r[0] for r in con.sql(f"DESCRIBE SELECT * FROM {rel}").fetchall()}
    if "user_id" not in cols:
        return []
    return con.execute(f"""
        WITH ev AS (SELECT * FROM {rel} WHERE tenant = $t),
             mine AS (SELECT trace_id, turn_id FROM ev WHERE user_id = $u),
             traces AS (SELECT DISTINCT trace_id FROM mine WHERE trace_id IS NOT NULL),
             turns AS (SELECT DISTINCT turn_id FROM mine WHERE turn_id IS NOT NULL)
        SELECT event_id, type, trace_id, turn_id, payload FROM ev
        WHERE user_id = $u OR (user_id IS NULL AND (trace_id IN (SELECT trace_id FROM traces)
                                                     OR turn_id IN (SELECT turn_id FROM turns)))""",
                       {"t": tenant, "u": user}).fetchall()


def _prompt_hash(text: str) -> str:
    return hashlib.sha256(text[:PROMPT_CHARS].encode()).hexdigest()


def _last_user(messages: list[dict]) -> str:
    return str(next((m.get("content") or "" for m in reversed(messages)
                     if isinstance(m, dict) and m.get("role") == "user"), ""))


def _find(cfg: TracerlConfig, tenant: str, user: str, known: dict[str, Any]) -> dict[str, list[str]]:
    ids = {k: set(known.get(k) or []) for k in ("event_ids", "trace_ids", "turn_ids", "prompts")}
    for event_id, typ, trace_id, turn_id, payload in _events_of(cfg, tenant, user):
        ids["event_ids"].add(event_id)
        if trace_id:
            ids["trace_ids"].add(trace_id)
        if turn_id:
            ids["turn_ids"].add(turn_id)
        if typ == "model_turn" and payload:
            try:
                messages = json.loads(payload).get("input_messages") or []
                ids["prompts"].add(_prompt_hash(_last_user(messages)))
            except (ValueError, AttributeError):
                pass
    return {k: sorted(v) for k, v in ids.items()}


def _dataset(cfg: TracerlConfig, name: str):
    table = delta.open_table(cfg.table_store, name)
    return table, (table.to_pyarrow_dataset() if table is not None else None)


def _col(name: str):
    """A string column as plain strings (delta-rs datasets read them as string views, which is_in lacks)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.field(name).cast(pa.string())


def _predicate(tenant: str, name: str, ids: dict[str, list[str]]) -> tuple[str, Any, Any] | None:
    """(delta-rs SQL, pyarrow expression on the tenant, pyarrow expression on the rest) selecting the
    user's rows of ``name``; None: none can be there."""
    import pyarrow.compute as pc

    t = pc.field("tenant") == tenant
    if name == EVENTS:
        if not ids["event_ids"]:
            return None
        return (f"tenant = {_q(tenant)} AND {_in('event_id', ids['event_ids'])}", t,
                _col("event_id").isin(ids["event_ids"]))
    turns, traces = ids["turn_ids"], ids["trace_ids"]
    if not turns and not (traces and name in TRACE_TABLES):
        return None
    sql, expr = _in("turn_id", turns), _col("turn_id").isin(turns)
    if name in TRACE_TABLES and traces:
        sql, expr = f"({sql} OR {_in('trace_id', traces)})", expr | _col("trace_id").isin(traces)
    return f"tenant = {_q(tenant)} AND {sql}", t, expr


def _quarantined(cfg: TracerlConfig, tenant: str, ids: dict[str, list[str]], user: str,
                 raw_user: str | None) -> tuple[list[tuple[str, int, int]], list[str]]:
    """Quarantine rows whose raw bytes are an event of the tenant naming the user (their pseudonym,
    their id in clear, one of their trace/turn/event ids): their (topic, partition, offset), and files."""
    table, data = _dataset(cfg, QUARANTINE)
    if data is None:
        return [], []
    needles = [n.encode() for n in {user, *ids["trace_ids"], *ids["turn_ids"], *ids["event_ids"]} if n]
    keys, files = [], set()
    for frag in data.get_fragments():
        t = frag.to_table(columns=["raw_value", "kafka_topic", "kafka_partition", "kafka_offset"])
        for raw, topic, part, off in zip(*(t[c].to_pylist() for c in t.column_names)):
            if not raw or not any(n in raw for n in needles + ([raw_user.encode()] if raw_user else [])):
                continue
            try:
                ev = json.loads(raw)
            except ValueError:
                ev = None
            if isinstance(ev, dict):
                if ev.get("tenant") not in (None, tenant):
                    continue
                named = ev.get("user") in (user, raw_user) and ev.get("user") is not None
                if not (named or ev.get("trace_id") in ids["trace_ids"] or ev.get("turn_id") in ids["turn_ids"]
                        or ev.get("event_id") in ids["event_ids"]):
                    continue
            elif not any(n in raw for n in needles):  # not JSON: only the pseudonym and ids, never a clear id
                continue
            keys.append((topic, part, off))
            files.add(frag.path)
    return sorted(set(keys), key=str), sorted(files)


def _plan_lake(cfg: TracerlConfig, tenant: str, user: str, ids: dict[str, list[str]],
               raw_user: str | None) -> dict[str, dict[str, Any]]:
    """Per lake table: the user's rows (count) and the data files holding them (paths in the table)."""
    plan: dict[str, dict[str, Any]] = {}
    for name in (EVENTS, *TURN_TABLES):
        pred = _predicate(tenant, name, ids)
        table, data = _dataset(cfg, name)
        if pred is None or data is None:
            continue
        names = set(data.schema.names)
        if name in TRACE_TABLES and "trace_id" not in names:
            continue
        rows, files = 0, []
        partitioned = "tenant" in delta.PARTITIONS[name]  # else a column of the files
        for frag in data.get_fragments(filter=pred[1] if partitioned else None):
            n = frag.count_rows(filter=pred[2] if partitioned else pred[1] & pred[2])
            if n:
                rows += n
                files.append(frag.path)
        if rows:
            plan[name] = {"rows": rows, "predicate": pred[0], "files": files}
    keys, files = _quarantined(cfg, tenant, ids, user, raw_user)
    if keys:
        pred = " OR ".join(f"(kafka_topic = {_q(t)} AND kafka_partition = {int(p)} AND kafka_offset = {int(o)})"
                           for t, p, o in keys)
        plan[QUARANTINE] = {"rows": len(keys), "predicate": pred, "files": files}
    return plan


# -- the lake ----------------------------------------------------------------------------------------

def _delete_lake(cfg: TracerlConfig, request: dict[str, Any]) -> None:
    from deltalake import CommitProperties

    for name, step in sorted(request["lake"].items()):
        table = delta.open_table(cfg.table_store, name)
        if table is None:
            continue
        for attempt in range(5):
            try:
                table.delete(step["predicate"], commit_properties=CommitProperties(
                    custom_metadata={"tracerl.run": request["id"]}))
                break
            except Exception as err:  # noqa: BLE001 - a concurrent commit: re-read and delete again
                if attempt == 4 or "onflict" not in str(err) and "ommit" not in str(err):
                    raise
                table = delta.open_table(cfg.table_store, name)
        if name == EVENTS:  # before _purge: it needs the delete's log entries
            _record_events_rewrite(cfg, request["id"])
        _purge(cfg, name, step["files"])


def _record_events_rewrite(cfg: TracerlConfig, request_id: str) -> None:
    """Tell the reward stage that the `events` files this request's delete wrote hold rows it has
    read (`reward_tables.record_rewrite`), else it would read them again as new. Found by the
    delete's commit, so a rerun after a crash here records them too."""
    from pipelines.lake import reward_tables

    table = delta.open_table(cfg.table_store, EVENTS)
    for commit in table.history() if table is not None else []:
        if commit.get("tracerl.run") == request_id and commit.get("operation") == "DELETE":
            v = int(commit["version"])
            before, after = (set(delta.relative(cfg.table_store, EVENTS, delta.open_table(
                cfg.table_store, EVENTS, version=x).file_uris())) for x in (v - 1, v))
            reward_tables.record_rewrite(cfg.table_store, before - after, after - before)


def _rel(path: str, base: str) -> str:
    base = base.rstrip("/") + "/"
    return path[len(base):] if path.startswith(base) else path.split("://", 1)[-1].lstrip("/")


def _purge(cfg: TracerlConfig, name: str, files: list[str]) -> None:
    """Remove the data files the delete took out of the table, then every log entry before a new
    checkpoint at once (the entries' file statistics quote column values). Idempotent."""
    from pyarrow.fs import FileType

    table = delta.open_table(cfg.table_store, name)
    if table is None:
        return
    base = cfg.table_store.table_uri(name)
    live = {_rel(u, base) for u in table.file_uris()}
    fs = delta.table_fs(cfg.table_store, name)
    for f in files:
        rel = _rel(f, base)
        if rel not in live and fs.get_file_info(rel).type == FileType.File:
            fs.delete_file(rel)
    delta.expire_log(cfg.table_store, name)


# -- caches, gateway files, artifacts ----------------------------------------------------------------

def _sqlite(path: Path, table: str, tenant: str, turns: list[str], dry: bool) -> int:
    if not path.is_file() or not turns:
        return 0
    con = sqlite3.connect(path, timeout=30)
    try:
        n = 0
        for i in range(0, len(turns), 500):
            part = turns[i:i + 500]
            where = f"tenant = ? AND turn_id IN ({','.join('?' * len(part))})"
            if dry:
                n += con.execute(f"SELECT count(*) FROM {table} WHERE {where}", [tenant, *part]).fetchone()[0]
            else:
                with con:
                    n += con.execute(f"DELETE FROM {table} WHERE {where}", [tenant, *part]).rowcount
        if not dry:
            con.execute("VACUUM")  # the freed pages rewritten: the deleted rows' bytes are gone from the file
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # ... and from the write-ahead log
        return n
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):
            return 0
        raise
    finally:
        con.close()


def _caches(cfg: TracerlConfig) -> dict[str, tuple[Path, str]]:
    from pipelines.reward.judge import cache_path as judge_cache
    from pipelines.train.feature_cache import cache_path as feature_cache

    return {"judge_verdicts": (judge_cache(cfg), "verdicts"), "reward_model_features": (feature_cache(cfg), "features")}


def _names(ev: Any, tenant: str, user: str, ids: dict[str, set]) -> bool:
    if not isinstance(ev, dict) or ev.get("tenant") != tenant:
        return False
    return (ev.get("user") == user or ev.get("trace_id") in ids["trace_ids"] or ev.get("turn_id") in ids["turn_ids"]
            or ev.get("event_id") in ids["event_ids"])


def _gateway_files(cfg: TracerlConfig, tenant: str, user: str, ids: dict[str, list[str]], dry: bool
                   ) -> tuple[dict[str, int], int]:
    """Journal, spill, rejected and corrupt-line files without the user's events: (counts, lines in open segments left)."""
    sets = {k: set(ids.get(k) or []) for k in ("event_ids", "trace_ids", "turn_ids")}
    needles = [n for n in {user, *ids["trace_ids"], *ids["turn_ids"], *ids["event_ids"]} if n]
    counts, left = {"gateway_journal": 0, "gateway_spill": 0}, 0

    def journal_event(line: str) -> Any:
        return json.loads(line.split("\t", 4)[4])

    def other(line: str) -> bool:  # rejected.jsonl / corrupt.jsonl: an event, or a line of text
        try:
            rec = json.loads(line)
        except ValueError:
            return any(n in line for n in needles)
        ev = rec.get("event") if isinstance(rec, dict) else None
        return _names(ev, tenant, user, sets) or any(n in str(rec.get("text", "")) for n in needles) \
            if isinstance(rec, dict) else False

    from pipelines.rights.retention import being_written, spill_dirs

    for spill in spill_dirs(cfg):
        journal = sorted((spill / "journal").glob("journal-*.log")) if (spill / "journal").is_dir() else []
        spills = sorted(spill.glob("spill-*.jsonl"))
        live = being_written(journal + spills)
        groups = [("gateway_journal", p, journal_event) for p in journal] + \
                 [("gateway_spill", p, json.loads) for p in spills] + \
                 [("gateway_spill", spill / n, None) for n in ("rejected.jsonl", "corrupt.jsonl") if (spill / n).is_file()]
        for store, path, parse in groups:
            try:
                lines = path.read_text(errors="surrogateescape").splitlines()
            except FileNotFoundError:
                continue  # swept meanwhile
            keep, hit = [], 0
            for line in lines:
                try:
                    match = _names(parse(line), tenant, user, sets) if parse else other(line)
                except (ValueError, IndexError):
                    match = any(n in line for n in needles)
                if match:
                    hit += 1
                else:
                    keep.append(line)
            if not hit:
                continue
            if path in live:
                left += hit
                continue
            counts[store] += hit
            if not dry:
                tmp = path.with_name(f".{path.name}.forget.tmp")
                with open(tmp, "w", errors="surrogateescape") as fh:
                    fh.write("".join(ln + "\n" for ln in keep))
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
                if not keep and parse is not None:
                    path.unlink(missing_ok=True)
    return counts, left


def _artifact_tables(cfg: TracerlConfig) -> list[Path]:
    root = Path(cfg.artifact_root)
    return sorted(root.glob(f"**/artifacts/gate/{SIDE_BY_SIDE}")) if root.is_dir() else []


def _review_tables(cfg: TracerlConfig, prompts: list[str], dry: bool) -> int:
    """Rows of the gate's side-by-side tables whose prompt is one of the user's; the tables rewritten without them."""
    wanted, n = set(prompts), 0
    if not wanted:
        return 0
    for path in _artifact_tables(cfg):
        table = json.loads(path.read_text())
        cols = table.get("columns") or []
        if "prompt" not in cols:
            continue
        i = cols.index("prompt")
        rows = table.get("data") or []
        keep = [r for r in rows if _prompt_hash(str(r[i])) not in wanted]
        if len(keep) == len(rows):
            continue
        n += len(rows) - len(keep)
        if not dry:
            from pipelines.durable import fsync_dir

            tmp = path.with_name(f".{path.name}.forget.tmp")
            with open(tmp, "w") as fh:
                json.dump({**table, "data": keep}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            fsync_dir(path.parent)
    return n


# -- marks ----------------------------------------------------------------------------------------------

def _trained_versions(cfg: TracerlConfig, tenant: str, turns: list[str]) -> list[tuple[str, int]]:
    import duckdb

    from pipelines.lake.ledger import ledger_source

    if not turns:
        return []
    con = duckdb.connect()
    src = ledger_source(con, cfg.table_store)
    con.register("_turns", __import__("pyarrow").table({"turn_id": turns}))
    return [(t, int(v)) for t, v in con.execute(
        f"SELECT DISTINCT task, adapter_version FROM {src} WHERE tenant = ? AND adapter_version > 0 "
        f"AND turn_id IN (SELECT turn_id FROM _turns) ORDER BY ALL", [tenant]).fetchall()]


def _with_descendants(cfg: TracerlConfig, tenant: str, direct: list[tuple[str, int]]) -> list[dict[str, Any]]:
    from pipelines.adapters.store import AdapterStore

    store, out = AdapterStore(cfg.adapter_root), []
    for task in sorted({t for t, _ in direct}):
        tainted = {v for t, v in direct if t == task}
        for av in store.list(tenant, task):  # oldest first: a parent is seen before its children
            parent = av.meta.get("parent_version")
            if av.version in tainted or (parent is not None and int(parent) in tainted):
                tainted.add(av.version)
                out.append({"task": task, "version": av.version, "direct": (task, av.version) in set(direct)})
        out += [{"task": task, "version": v, "direct": True} for v in sorted(tainted)
                if not any(o["task"] == task and o["version"] == v for o in out)]  # trained, never published
    return out


def _mark(cfg: TracerlConfig, request: dict[str, Any]) -> None:
    from pipelines.adapters import promote, registry
    from pipelines.adapters.store import FORGOTTEN, AdapterStore

    store = AdapterStore(cfg.adapter_root)
    tenant, rid, policy = request["tenant"], request["id"], request["policy"]
    for v in request["versions"]:
        why = "trained on the user's turns" if v["direct"] else "descends from a version trained on them"
        try:
            store.mark(tenant, v["task"], v["version"], FORGOTTEN, rid, {"policy": policy, "why": why})
        except KeyError:
            pass  # never published (a learner killed after its ledger commit)
        mv = registry.version_for_adapter(cfg, tenant, v["task"], v["version"])
        if mv is not None:
            v["registry_version"] = str(mv.version)
            had = [x for x in mv.tags.get(registry.FORGOTTEN_TAG, "").split(",") if x]
            if rid not in had:
                promote.set_tags(cfg, tenant, v["task"], mv.version, {registry.FORGOTTEN_TAG: ",".join(had + [rid])})


def _champion_marked(cfg: TracerlConfig, request: dict[str, Any]) -> bool:
    from pipelines.adapters import registry

    for task in sorted({v["task"] for v in request["versions"]}):
        champ = registry.adapter_for_alias(cfg, request["tenant"], task, registry.CHAMPION)
        if any(v["task"] == task and v["version"] == champ for v in request["versions"]):
            return True
    return False


# -- the whole ---------------------------------------------------------------------------------------

def check_tenant(cfg: TracerlConfig, tenant: str) -> None:
    if not isinstance(tenant, str) or not IDENT.fullmatch(tenant):
        raise ForgetError(f"tenant {tenant!r} is not a tenant id ({IDENT.pattern})")
    from pipelines.deploy.keys import key_folder
    from pipelines.deploy.service import gateway_config

    home = Path(cfg.home)
    known = (tenant in gateway_config(cfg).api_keys or (key_folder(home) / f"{tenant}.key").is_file()
             or any(k.split("/")[0] == tenant for k in cfg.targets) or (Path(cfg.adapter_root) / tenant).is_dir()
             or (home / "privacy" / "secrets" / f"{tenant}.key").is_file())
    if not known and not delta.files(cfg.table_store, EVENTS, where=[("tenant", "=", tenant)])[1]:
        raise ForgetError(f"unknown tenant {tenant!r}: no key, suite, adapters, route nor data of it "
                          f"(`tracerl tenant list` shows the tenants)")


def forget(cfg: TracerlConfig, tenant: str, raw_user: str | None, actor: str | None = None, *,
           user: str | None = None) -> Receipt:
    """Forget ``raw_user`` (the app's id; or ``user``, the pseudonym, for a request filed by the
    gateway) of ``tenant``. Raises ForgetError (bad input) or ForgetRefused (not now): nothing done."""
    check_tenant(cfg, tenant)
    if user is None:
        if not isinstance(raw_user, str) or not raw_user.strip():
            raise ForgetError("--user is empty: give the user id the app sends as `user`")
        user = pseudonym(cfg, tenant, raw_user)
    actor = actor or default_actor()
    policy = cfg.for_target(tenant).privacy.on_forget
    hours = float(cfg.for_target(tenant).privacy.retrain_deadline_hours)
    with _exclusive(cfg, tenant):
        prior = fr.load_request(cfg.home, tenant, user)
        repeat = prior is not None and prior.get("status") == fr.DONE
        if prior is None or prior.get("status") == fr.REQUESTED and "lake" not in prior:
            request = {**(prior or fr.new_request(tenant, user, actor)), "actor": actor}
        else:
            request = prior
        if request.get("status") != fr.RUNNING:  # a fresh run (new, filed, or a repeat of a done one)
            ids = _find(cfg, tenant, user, request if repeat else {})
            if not any(ids[k] for k in ("event_ids", "turn_ids")) and not repeat:
                return Receipt(request["id"], tenant, user, actor, request["requested_at"], fr.now_iso(), "no_data",
                               policy)
            lake = _plan_lake(cfg, tenant, user, ids, raw_user)
            caches = {k: _sqlite(p, t, tenant, ids["turn_ids"], dry=True) for k, (p, t) in _caches(cfg).items()}
            gw, _ = _gateway_files(cfg, tenant, user, ids, dry=True)
            direct = _trained_versions(cfg, tenant, ids["turn_ids"])
            versions = _with_descendants(cfg, tenant, direct)
            if repeat:  # the same marks as the first time, plus any new
                versions += [v for v in prior.get("versions", []) if not any(
                    (o["task"], o["version"]) == (v["task"], v["version"]) for o in versions)]
            request.update({**ids, "status": fr.RUNNING, "actor": actor, "policy": policy,
                            "started_at": request.get("started_at") or fr.now_iso(), "lake": lake, "versions": versions,
                            "counts": {**{f"lake.{k}": v["rows"] for k, v in lake.items()}, **caches, **gw,
                                       "mlflow.review_table_rows": _review_tables(cfg, ids["prompts"], dry=True)},
                            "repeat": repeat})
            fr.save_request(cfg.home, request)  # the commit point: from here a rerun resumes
        _mark(cfg, request)
        fr.save_request(cfg.home, request)
        _delete_lake(cfg, request)
        for key, (path, table) in _caches(cfg).items():
            _sqlite(path, table, tenant, request["turn_ids"], dry=False)
        _, left = _gateway_files(cfg, tenant, user, request, dry=False)
        _review_tables(cfg, request["prompts"], dry=False)
        marked_champion = policy == "retrain" and _champion_marked(cfg, request)
        deadline = None
        if marked_champion:
            started = datetime.fromisoformat(request["started_at"])
            deadline = (started + timedelta(hours=hours)).isoformat(timespec="seconds")
        receipt = Receipt(request["id"], tenant, user, request["actor"], request["requested_at"], fr.now_iso(),
                          "done", policy, deadline, {k: int(v) for k, v in sorted(request["counts"].items())},
                          [{k: v[k] for k in ("task", "version", "direct", "registry_version") if k in v}
                           for v in request["versions"]],
                          {"gateway_open_segment_lines": left} if left else {}, bool(request.get("repeat")))
        fr.append_receipt(cfg.home, receipt.to_dict())
        request.update({"status": fr.DONE, "completed_at": receipt.completed_at, "deadline": deadline})
        fr.save_request(cfg.home, request)
        return receipt


def run_open_requests(cfg: TracerlConfig) -> list[Receipt]:
    """Carry out every request filed (the gateway's admin route) or interrupted: the Dagster ``forget_job``."""
    out = []
    for req in fr.open_requests(cfg.home):
        out.append(forget(cfg, req["tenant"], None, req.get("actor"), user=req["user"]))
    return out
