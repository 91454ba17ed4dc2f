"""Retention: a tenant's raw traffic leaves every store once its period has passed.

``privacy.retention_days`` (per tenant, ``[targets."<tenant>".privacy]``; 0 = keep) sets the
period. `apply_retention` (daily: Dagster's ``retention_daily``; by hand: ``tracerl retention
apply``) deletes, per tenant:

- the lake's ``events`` older than the tenant's *cutoff*, by event time, and what was derived
  from them: settled ``rewards`` (by turn time), ``reward_corrections`` (by event time), the rows
  of the reward stage's open state (``reward_provisional``, ``reward_pending``) older than it, and
  the ``reference_logprobs`` of turns no longer in the lake;
- ``quarantine`` rows (their raw bytes with them) by landing time (``quarantined_at``): a row
  whose raw message names a tenant the deployment knows follows that tenant's period; one that
  names none (not JSON, no tenant, a tenant nobody runs) follows the *shortest* period of any
  tenant, since it could be anyone's;
- the gateway's journal and spill segments whose every record is past its tenant's cutoff (a
  segment a live gateway may still write is never touched), and its ``rejected.jsonl`` /
  ``corrupt.jsonl`` once untouched for the shortest period;
- the gate's side-by-side review tables (``gate/side_by_side.json``, real prompts and replies) of
  gate runs started before the cutoff; the run, its metrics and its other artifacts stay.

The cutoff is a UTC midnight: that of the day ``retention_days`` before now, so traffic is kept
for ``retention_days`` whole days after the end of its UTC day, then goes at the next daily run
(between N and N + 1 days old, plus the schedule's lag). Whole days because ``events``,
``rewards`` and ``reward_corrections`` are partitioned by (tenant, date): a delete drops whole data
files and never rewrites one, and the lake stays the append-only set of files the reward stage
reads incrementally (a rewritten file would read as new: its events counted twice).

Then the removed data files are vacuumed at once (retention 0, lite: only files a commit removed,
never a file a writer has not committed yet) and the tables' logs before the delete expired
(a checkpoint, then the older log entries and checkpoints deleted): a Delta log's ``add`` entries
carry per-file column statistics, the minimum and maximum of each text column, so the log would
otherwise still quote the deleted text. Time travel: a version of a table from before a retention
delete cannot be read afterwards (its files are gone, and so is its log entry).

Idempotent: each step is computed from the tables as they are now, so a rerun (or a run after a
crash at any point) deletes what is left and nothing more; a table with nothing to delete gets no
commit. The learner's ledger (``trained_turns``: turn ids and adapter versions, no text) and the
consent records stay: the ledger is the lineage of the adapters (which version trained on what).

Replay: the learner replays turns it finds in the lake, so a turn past the period leaves the
replay pool with its events and rewards.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable

import duckdb

from pipelines.config import TracerlConfig
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS, QUARANTINE, REFERENCE
from pipelines.lake.tables import CORRECTIONS, PENDING, PROVISIONAL, REWARDS

MARK = "tracerl.retention"  # commit metadata of every retention delete: its run id
UNKNOWN = "(no tenant)"     # quarantine rows and segment lines that name no tenant the deployment knows
HISTORY = 300               # commits back a later run looks for a retention delete whose log is not expired yet
IN_CHUNK = 1000             # ids per delete predicate
LOG_GRACE = timedelta(hours=1)  # log entries younger than this stay until the next run (`_expire_log`)

# The stores of the report, in order: lake tables (rows), gateway segments (records), MLflow (files).
BY_DAY = {EVENTS: "date", REWARDS: "date", CORRECTIONS: "date"}  # partitioned by (tenant, date): whole files
BY_TIME = {PROVISIONAL: "turn_time", PENDING: "event_time"}      # the open state: rows older than the cutoff
TABLES = [EVENTS, REWARDS, CORRECTIONS, PROVISIONAL, PENDING, REFERENCE, QUARANTINE]
JOURNAL, SPILL, REVIEW = "journal", "spill", "review_artifacts"
STORES = [*TABLES, JOURNAL, SPILL, REVIEW]


@dataclass
class RetentionReport:
    """What one `apply_retention` did (or, ``dry_run``, would do)."""

    now: str                                   # ISO time the cutoffs were computed from
    dry_run: bool
    run: str                                   # the id on its delete commits (``tracerl.retention``)
    cutoffs: dict[str, str | None] = field(default_factory=dict)  # tenant -> cutoff (ISO), None: kept
    default_cutoff: str | None = None          # rows of no known tenant: the shortest period's cutoff
    deleted: dict[str, dict[str, int]] = field(default_factory=dict)  # store -> tenant -> rows / records / files
    segment_files: dict[str, int] = field(default_factory=dict)  # journal / spill / logs -> whole files deleted
    vacuumed: dict[str, int] = field(default_factory=dict)       # table -> data files removed from storage
    log_expired: dict[str, int] = field(default_factory=dict)    # table -> log entries and checkpoints deleted
    seconds: float = 0.0

    def add(self, store: str, tenant: str, n: int) -> None:
        if n:
            by = self.deleted.setdefault(store, {})
            by[tenant] = by.get(tenant, 0) + n

    def total(self, store: str | None = None) -> int:
        stores = [store] if store else list(self.deleted)
        return sum(sum(self.deleted.get(s, {}).values()) for s in stores)

    def to_dict(self) -> dict:
        return {"now": self.now, "dry_run": self.dry_run, "run": self.run, "cutoffs": self.cutoffs,
                "default_cutoff": self.default_cutoff, "deleted": self.deleted,
                "segment_files": self.segment_files, "vacuumed": self.vacuumed, "log_expired": self.log_expired,
                "seconds": round(self.seconds, 3)}

    def lines(self) -> list[str]:
        """The report for a person: cutoffs, then what went per store and tenant."""
        verb = "would delete" if self.dry_run else "deleted"
        out = [f"retention {'(dry run) ' if self.dry_run else ''}as of {self.now}"]
        for tenant, c in sorted(self.cutoffs.items()):
            out.append(f"  {tenant}: {'kept (retention_days = 0)' if c is None else 'before ' + c}")
        out.append(f"  rows of no known tenant: {'kept' if self.default_cutoff is None else 'before ' + self.default_cutoff}")
        for store in STORES:
            by = self.deleted.get(store, {})
            what = "review tables" if store == REVIEW else "records" if store in (JOURNAL, SPILL) else "rows"
            detail = ", ".join(f"{t} {n}" for t, n in sorted(by.items()))
            out.append(f"{store}: {verb} {sum(by.values())} {what}" + (f" ({detail})" if detail else ""))
        if self.segment_files:
            out.append("gateway files " + verb + ": " + ", ".join(f"{k} {v}" for k, v in sorted(self.segment_files.items())))
        if not self.dry_run:
            out.append("vacuumed data files: " + (", ".join(f"{k} {v}" for k, v in sorted(self.vacuumed.items()) if v)
                                                  or "none"))
            out.append("expired log entries: " + (", ".join(f"{k} {v}" for k, v in sorted(self.log_expired.items()) if v)
                                                   or "none"))
        out.append(f"{self.seconds:.1f} s")
        return out


def cutoff(days: int, now: datetime) -> datetime | None:
    """The UTC midnight before which a tenant with ``days`` of retention has nothing left (None: 0, kept)."""
    if days <= 0:
        return None
    day = (now.astimezone(timezone.utc) - timedelta(days=days)).date()
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc)


def apply_retention(cfg: TracerlConfig, now: datetime | None = None, dry_run: bool = False) -> RetentionReport:
    """Delete every tenant's traffic past its period from every store (module docstring). ``now``:
    the time the cutoffs count back from (default: the clock). ``dry_run``: count only."""
    started = time.monotonic()
    now = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    report = RetentionReport(now=_iso(now), dry_run=dry_run,
                             run=f"retention-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}")
    store = cfg.table_store
    policy = _Policy(cfg, now)
    known = _lake_tenants(store) | {k.partition("/")[0] for k in cfg.targets}
    for tenant in sorted(known):
        policy.of(tenant)
    policy.close_known()
    report.default_cutoff = _iso(policy.default)

    for tenant in sorted(known):
        c = policy.of(tenant)
        if c is None:
            continue
        for dataset, column in BY_DAY.items():
            _delete(store, dataset, f"tenant = {_q(tenant)} AND {column} < {_q(c.date().isoformat())}",
                    tenant, report, dry_run)
        for dataset, column in BY_TIME.items():
            _delete(store, dataset, f"tenant = {_q(tenant)} AND {column} < {_q(_iso(c))}", tenant, report, dry_run,
                    partitioned=False)
        _delete_references(store, tenant, c, report, dry_run)
    _delete_quarantine(store, policy, report, dry_run)
    if not dry_run:
        for dataset in TABLES:
            report.vacuumed[dataset] = _vacuum(store, dataset)
            report.log_expired[dataset] = _expire_log(store, dataset)
    _segments(cfg, policy, report, dry_run)
    _review_tables(cfg, policy, report, dry_run)
    report.cutoffs = {t: _iso(c) for t, c in sorted(policy.cutoffs.items())}
    report.seconds = time.monotonic() - started
    return report


class _Policy:
    """Each tenant's cutoff (its ``privacy.retention_days``), and the one for what names no known tenant."""

    def __init__(self, cfg: TracerlConfig, now: datetime):
        self.cfg, self.now = cfg, now
        self.cutoffs: dict[str, datetime | None] = {}
        self.default: datetime | None = None
        self.known: set[str] = set()  # the tenants the deployment knows (`close_known`)

    def of(self, tenant: str) -> datetime | None:
        if tenant not in self.cutoffs:
            self.cutoffs[tenant] = cutoff(int(self.cfg.for_target(tenant).privacy.retention_days), self.now)
        return self.cutoffs[tenant]

    def close_known(self) -> None:
        """The known tenants are in: the shortest period among them and the global setting is the default."""
        self.known = set(self.cutoffs)
        found = [c for c in [*self.cutoffs.values(), cutoff(int(self.cfg.privacy.retention_days), self.now)] if c]
        self.default = max(found) if found else None  # the latest cutoff: the shortest period

    def of_named(self, tenant: str | None) -> datetime | None:
        """A tenant named by untrusted bytes: its own cutoff when the deployment knows it, else the default."""
        return self.cutoffs[tenant] if tenant in self.known else self.default

    @property
    def latest(self) -> datetime | None:
        found = [c for c in [*self.cutoffs.values(), self.default] if c]
        return max(found) if found else None


# -- the lake ---------------------------------------------------------------------------------------

def _delete(store: delta.Where, dataset: str, predicate: str, tenant: str, report: RetentionReport,
            dry_run: bool, partitioned: bool = True) -> int:
    """Delete ``dataset``'s rows matching ``predicate`` (SQL both DuckDB and delta-rs read) of
    ``tenant``; counted first, so a table with nothing to delete gets no commit."""
    n = _count(store, dataset, predicate, tenant if partitioned else None)
    if n and not dry_run:
        n = _delete_rows(store, dataset, predicate, report.run)
    report.add(dataset, tenant, n)
    return n


def _count(store: delta.Where, dataset: str, predicate: str, tenant: str | None = None) -> int:
    _, paths = delta.files(store, dataset, where=[("tenant", "=", tenant)] if tenant else None)
    if not paths:
        return 0
    con = _duck()
    try:
        src = delta.scan(con, store, dataset, paths, "_retention")
        return int(con.execute(f"SELECT count(*) FROM {src} WHERE {predicate}").fetchone()[0])
    finally:
        con.close()


def _delete_rows(store: delta.Where, dataset: str, predicate: str, run: str, tries: int = 5) -> int:
    """One Delta delete, marked with the run; retried on a commit conflict (a concurrent writer of
    the same files). The rows it deleted."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    for attempt in range(tries):
        table = delta.open_table(store, dataset)
        if table is None:
            return 0
        try:
            metrics = table.delete(predicate, commit_properties=CommitProperties(custom_metadata={MARK: run}))
            return int(metrics.get("num_deleted_rows") or 0)
        except CommitFailedError:
            if attempt == tries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    return 0


def _delete_references(store: delta.Where, tenant: str, c: datetime, report: RetentionReport, dry_run: bool) -> None:
    """The tenant's reference logprobs of turns with no model turn left in ``events`` once the
    events before ``c`` are gone (computed the same before and after that delete: a rerun after a
    crash between the two finds them still)."""
    _, refs = delta.files(store, REFERENCE, where=[("tenant", "=", tenant)])
    if not refs or delta.open_table(store, EVENTS) is None:
        return  # no table of events read as "no turns": never a reason to delete every reference
    _, events = delta.files(store, EVENTS, where=[("tenant", "=", tenant)])
    con = _duck()
    try:
        ref_src = delta.scan(con, store, REFERENCE, refs, "_refs")
        live = "SELECT NULL::VARCHAR AS turn_id WHERE false"
        if events:
            ev_src = delta.scan(con, store, EVENTS, events, "_events")
            live = (f"SELECT turn_id FROM {ev_src} WHERE type = 'model_turn' AND turn_id IS NOT NULL "
                    f"AND date >= {_q(c.date().isoformat())}")
        gone = [r[0] for r in con.execute(
            f"SELECT DISTINCT turn_id FROM {ref_src} WHERE turn_id NOT IN ({live}) ORDER BY 1").fetchall()]
    finally:
        con.close()
    for chunk in _chunks(gone, IN_CHUNK):
        _delete(store, REFERENCE, f"tenant = {_q(tenant)} AND turn_id IN ({', '.join(map(_q, chunk))})",
                tenant, report, dry_run)


def _delete_quarantine(store: delta.Where, policy: _Policy, report: RetentionReport, dry_run: bool) -> None:
    """Quarantine rows past their cutoff by landing time; each row's tenant read from its raw message
    (`_Policy.of_named`)."""
    latest = policy.latest
    if latest is None:
        return
    _, paths = delta.files(store, QUARANTINE)
    if not paths:
        return
    con = _duck()
    try:
        src = delta.scan(con, store, QUARANTINE, paths, "_quarantine")
        rows = con.execute(f"SELECT kafka_topic, kafka_partition, kafka_offset, quarantined_at, raw_value FROM {src} "
                           f"WHERE quarantined_at < {_q(_iso(latest))}").fetchall()
    finally:
        con.close()
    groups: dict[tuple[str, str, int, datetime], list[int]] = {}
    for topic, partition, offset, landed, raw in rows:
        named = _tenant_of(raw)
        c = policy.of_named(named)
        if c is None or landed >= c:
            continue
        who = named if named in policy.known else UNKNOWN
        groups.setdefault((who, topic, partition, c), []).append(offset)
    for (who, topic, partition, c), offsets in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        for chunk in _chunks(sorted(set(offsets)), IN_CHUNK):
            _delete(store, QUARANTINE, f"kafka_topic = {_q(topic)} AND kafka_partition = {int(partition)} AND "
                                       f"kafka_offset IN ({', '.join(map(str, chunk))}) AND quarantined_at < {_q(_iso(c))}",
                    who, report, dry_run, partitioned=False)


def _tenant_of(raw: bytes | None) -> str | None:
    """The ``tenant`` a quarantined message names, if it is a JSON object that names one."""
    try:
        value = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        return None
    tenant = value.get("tenant") if isinstance(value, dict) else None
    return tenant if isinstance(tenant, str) else None


def _lake_tenants(store: delta.Where) -> set[str]:
    """Every tenant with rows in a table retention deletes from."""
    out: set[str] = set()
    for dataset in (EVENTS, REWARDS, CORRECTIONS, REFERENCE):
        table = delta.open_table(store, dataset)
        if table is not None:
            out |= {p["tenant"] for p in table.partitions() if p.get("tenant")}
    for dataset in (PROVISIONAL, PENDING):  # partitioned by snapshot: tenant is a column
        _, paths = delta.files(store, dataset)
        if paths:
            con = _duck()
            try:
                src = delta.scan(con, store, dataset, paths, "_open_state")
                out |= {r[0] for r in con.execute(f"SELECT DISTINCT tenant FROM {src} WHERE tenant IS NOT NULL").fetchall()}
            finally:
                con.close()
    return out


def _vacuum(store: delta.Where, dataset: str) -> int:
    """Delete the data files commits removed, at once (retention 0, which the retention check would
    refuse: ``enforce_retention_duration=False``). Lite: a file no commit names (a write in flight)
    is never touched; `delta.vacuum` (a day old, full) is the one for those. The files it deleted
    (a removed file stays listed for a week after it is gone: those are not counted again)."""
    import pyarrow.fs as pafs

    table = delta.open_table(store, dataset)
    if table is None:
        return 0
    listed = table.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False, full=False)
    if not listed:
        return 0
    present = [i for i in delta.table_fs(store, dataset).get_file_info(listed) if i.type != pafs.FileType.NotFound]
    if present:
        table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False, full=False)
    return len(present)


def _expire_log(store: delta.Where, dataset: str) -> int:
    """After a retention delete: `delta.expire_log`, keeping the entries younger than `LOG_GRACE`: a
    writer that read the table a moment ago checks its commit against the entries after its snapshot,
    so the last hour's stay until the next run (they hold what landed in that hour). Nothing when no
    retention delete among the last `HISTORY` commits has such entries before it."""
    table = delta.open_table(store, dataset)
    if table is None:
        return 0
    marked = [h["version"] for h in table.history(HISTORY) if h.get("operation") == "DELETE" and MARK in h]
    return delta.expire_log(store, dataset, LOG_GRACE, below=max(marked)) if marked else 0


# -- the gateway's journal and spill ------------------------------------------------------------------

_SEGMENT = re.compile(r"^(spill|journal)-(\d+)-(\d+)-(\d+)\.(jsonl|log)$")
LOGS = ("rejected.jsonl", "corrupt.jsonl")  # the emitter's append-only logs beside the spill


def spill_dirs(cfg: TracerlConfig) -> list[Path]:
    """Every gateway's spill folder under the home: the single gateway's and each instance's."""
    from pipelines.deploy.service import gateway_dirs

    dirs = []
    for instance in [""] + sorted(p.name for p in (Path(cfg.home) / "gateways").glob("*") if p.is_dir()):
        try:
            dirs.append(gateway_dirs(cfg, replace(cfg.gateway, instance=instance))[1])
        except ValueError:  # a folder no gateway instance can be named: not a gateway's
            continue
    return [d for d in dict.fromkeys(dirs) if d.is_dir()]


def _segments(cfg: TracerlConfig, policy: _Policy, report: RetentionReport, dry_run: bool) -> None:
    from pipelines.deploy.journal import Journal

    for folder in spill_dirs(cfg):
        for store, where, pattern in ((SPILL, folder, "spill-*.jsonl"),
                                      (JOURNAL, folder / "journal", f"{Journal.PREFIX}*.log")):
            files = sorted(where.glob(pattern))
            writing = being_written(files)
            for path in files:
                if path in writing:
                    continue
                records = _records(path, store)
                if records is None or not all(c is not None and t < c for c, t in
                                               ((policy.of(n) if n else policy.default, t) for n, t in records)):
                    continue
                if not dry_run:
                    path.unlink(missing_ok=True)
                report.segment_files[store] = report.segment_files.get(store, 0) + 1
                for n, _ in records:
                    report.add(store, n or UNKNOWN, 1)
        for name in LOGS:  # no time per line: deleted whole once untouched for the shortest period
            path = folder / name
            if policy.default is not None and path.is_file() and _mtime(path) < policy.default:
                if not dry_run:
                    path.unlink(missing_ok=True)
                report.segment_files["logs"] = report.segment_files.get("logs", 0) + 1


def being_written(files: Iterable[Path]) -> set[Path]:
    """The segment each live writer (``<kind>-<start>-<pid>-<n>``, its process alive) appends to:
    its highest ``n``. Its other segments are closed: never appended to again."""
    newest: dict[tuple[str, str, str], tuple[int, Path]] = {}
    for path in files:
        m = _SEGMENT.match(path.name)
        if m is None:
            newest[(path.name, "", "")] = (0, path)  # a name of no writer we know: left alone
            continue
        key = (m.group(1), m.group(2), m.group(3))
        if key not in newest or int(m.group(4)) > newest[key][0]:
            newest[key] = (int(m.group(4)), path)
    return {path for (kind, start, pid), (_, path) in newest.items() if not pid or _alive(int(pid))}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # someone else's process: alive, not ours to judge
    return True


def _records(path: Path, store: str) -> list[tuple[str | None, datetime]] | None:
    """(tenant, event time) of each record of a segment; a line that does not parse counts as no
    tenant at the file's last write. None: the file is gone."""
    from pipelines.contract.validate import parse_time
    from pipelines.deploy.journal import parse_line

    try:
        text = path.read_text(errors="replace")
        written = _mtime(path)
    except FileNotFoundError:
        return None
    out: list[tuple[str | None, datetime]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        tenant, when = None, written
        try:
            event = json.loads(parse_line(line)[2] if store == JOURNAL else line)
            if isinstance(event, dict):
                tenant = event.get("tenant") if isinstance(event.get("tenant"), str) else None
                when = parse_time(event.get("event_time"))
        except Exception:  # noqa: BLE001 - torn, garbled or no valid time: judged by the file's last write
            pass
        out.append((tenant, when))
    return out or [(None, written)]


def _mtime(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)


# -- MLflow: the gate's review tables -----------------------------------------------------------------

def _review_tables(cfg: TracerlConfig, policy: _Policy, report: RetentionReport, dry_run: bool) -> None:
    """Delete ``gate/side_by_side.json`` of every gate run (any state, deleted runs too) that started
    before its tenant's cutoff; the run and the rest of it stay."""
    latest = policy.latest
    if latest is None or (cfg.mlflow.tracking_uri is None and not (Path(cfg.home) / "mlflow.db").exists()):
        return  # nothing can be past its period, or no MLflow store yet (none is created for this)
    from mlflow.entities import ViewType
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    from pipelines import tracking
    from pipelines.gate.side_by_side import ARTIFACT

    client = tracking.client(cfg)
    exp = client.get_experiment_by_name(cfg.mlflow.experiment)
    if exp is None:
        return
    query = f"tags.`tracerl.stage` = 'gate' AND attributes.start_time < {_ms(latest)}"
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], query, run_view_type=ViewType.ALL, max_results=500,
                                  page_token=token)
        for run in page:
            tenant = run.data.tags.get("tenant") or UNKNOWN
            c = policy.of(tenant) if tenant != UNKNOWN else policy.default
            if c is None or run.info.start_time >= _ms(c):
                continue
            repo = get_artifact_repository(run.info.artifact_uri)
            folder, _, _ = ARTIFACT.rpartition("/")
            if ARTIFACT not in {f.path for f in repo.list_artifacts(folder)}:
                continue
            if not dry_run:
                repo.delete_artifacts(ARTIFACT)
            report.add(REVIEW, tenant, 1)
        token = page.token
        if not token:
            break


# -- helpers ----------------------------------------------------------------------------------------

def _duck() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    return con


def _q(s: str) -> str:
    """A SQL string literal (DuckDB and delta-rs's DataFusion both read it)."""
    return "'" + str(s).replace("'", "''") + "'"


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _chunks(items: list, n: int) -> Iterable[list]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


__all__ = ["MARK", "RetentionReport", "STORES", "UNKNOWN", "apply_retention", "cutoff", "spill_dirs"]
