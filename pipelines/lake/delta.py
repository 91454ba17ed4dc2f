"""The lake's Delta Lake tables (delta-rs): `events` and `quarantine` (ingest), `trained_turns` and
`reference_logprobs` (the learner's), in the lake folder or on an object store
(`config.tables.TableStore`).

Why Delta and not Iceberg (issue #18, `bench/lake_format.py`, bench/RESULTS.md): Delta's
application transactions are exactly the exactly-once record Kafka ingest needs, one per Kafka
partition, versioned by offset, committed atomically with the files and checked by the writer
(two commits of one partition's offsets from the same table version: the second fails), with no
catalog service; Iceberg keeps such offsets only as free-form snapshot summary properties, which
its catalog does not check and a reader must walk back through snapshots to find per partition.
Measured side by side on a quiet machine: an ingest-sized commit 1.65x faster (15 against 25 ms),
a full DuckDB read 1.9x faster.

Exactly-once: every ingest commit carries, per Kafka partition it consumed, the application
transaction ``kafka/<topic>/<topic id>/<partition>`` with the last offset it landed as version.
`landed` reads them back: offsets at or below are in the table. A topic deleted and created again
has a new id, so its new log starts from nothing. Workers on disjoint partitions append at once
(delta-rs retries a blind append on the next version); two on one partition cannot both commit.

`events` is partitioned by tenant and date, `quarantine` by date, the learner's by tenant (the
Hive folders the views read, as before); a data file is part of the lake only once a commit in ``_delta_log`` names it, so
readers take the file list from the table, never a glob (`files`).
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable
from urllib.parse import unquote

import pyarrow as pa

from pipelines.config.tables import TableStore
from pipelines.durable import fsync_dir
from pipelines.lake.tables import CORRECTIONS, PENDING, PROVISIONAL, REWARD_RUNS, REWARDS

# Columns worth dictionary-encoding: few distinct values. Hashing unique ids and
# kilobyte payloads for a dictionary that is then abandoned costs ~40% of a write.
DICTIONARY_COLUMNS = ["type", "app", "task", "kafka_topic", "run_id", "reason"]

EVENTS = "events"
QUARANTINE = "quarantine"
TRAINED_TURNS = "trained_turns"  # the learner's ledger (`ledger.py`)
REFERENCE = "reference_logprobs"  # the learner's kept reference logprobs (`reference.py`)
CONSENT = "consent"  # end users' training consent records, append-only (`consent.py`)
PARTITIONS = {EVENTS: ["tenant", "date"], QUARANTINE: ["date"], TRAINED_TURNS: ["tenant"], REFERENCE: ["tenant"],
              CONSENT: ["tenant"],
              # the reward stage's (`reward_tables.py`): settled turns and corrections by tenant and
              # date, the open state by the run whose snapshot it is, the run log unpartitioned
              REWARDS: ["tenant", "date"], CORRECTIONS: ["tenant", "date"], PROVISIONAL: ["snapshot"],
              PENDING: ["snapshot"], REWARD_RUNS: []}
PARTITION_TYPES = {"tenant": pa.string(), "date": pa.date32(), "snapshot": pa.string()}

Coord = tuple[str, str, int]  # (topic, topic id or "", partition)
Where = Path | str | TableStore  # a lake folder, or `TracerlConfig.table_store` (a folder or an object store)


def store_of(where: Where) -> TableStore:
    return where if isinstance(where, TableStore) else TableStore(str(Path(where).resolve()))


def app_id(coord: Coord) -> str:
    topic, topic_id, partition = coord
    return f"kafka/{topic}/{topic_id or '-'}/{partition}"


def open_table(root: Where, dataset: str, version: int | None = None):
    """The dataset's DeltaTable (at ``version``), or None before its first commit."""
    from deltalake import DeltaTable

    store = store_of(root)
    uri = store.table_uri(dataset)
    if not DeltaTable.is_deltatable(uri, storage_options=store.storage_options):
        return None
    return DeltaTable(uri, version=version, storage_options=store.storage_options)


class LakeLayoutError(RuntimeError):
    pass


def check_layout(root: Where, dataset: str) -> None:
    """Refuse a dataset folder of the layout before Delta (Parquet files, no ``_delta_log``): a new
    table there would hide them. `pipelines/lake/migrate.py` moves them in."""
    store = store_of(root)
    path = Path(store.table_uri(dataset))
    if store.local and path.is_dir() and not (path / "_delta_log").exists() and any(path.rglob("*.parquet")):
        raise LakeLayoutError(f"{path} holds {dataset} of the lake layout before Delta Lake: "
                              "run `tracerl lake migrate` (once) first")


def landed(root: Where, coords: Iterable[Coord], dataset: str = EVENTS) -> dict[Coord, int]:
    """The last offset ``dataset`` holds per Kafka partition (absent: none of it landed)."""
    return marks_of(open_table(root, dataset), coords)


def marks_of(table, coords: Iterable[Coord]) -> dict[Coord, int]:
    """`landed` as of the snapshot ``table`` (a DeltaTable, or None before the first commit)."""
    if table is None:
        return {}
    out = {}
    for coord in coords:
        v = table.transaction_version(app_id(coord))
        if v is not None:
            out[coord] = int(v)
    return out


def _writer_properties(schema: pa.Schema):
    from deltalake import ColumnProperties, WriterProperties

    return WriterProperties(
        compression="ZSTD", default_column_properties=ColumnProperties(dictionary_enabled=False),
        column_properties={c: ColumnProperties(dictionary_enabled=True)
                           for c in DICTIONARY_COLUMNS if c in schema.names})


class CommitConflict(RuntimeError):
    """Another writer committed offsets of these partitions after the snapshot this one read."""


NO_TABLE = "no table"  # `append`'s ``base`` where the caller decided on a table not created yet


def append(root: Where, dataset: str, rows: pa.Table | pa.RecordBatchReader,
           offsets: dict[Coord, int] | None = None, marks: dict[str, int] | None = None,
           migrating: bool = False, base=None, info: dict[str, str] | None = None) -> int:
    """Append ``rows`` (with the dataset's partition columns) and, in the same commit, each
    partition's last offset in ``offsets``; the table's new version. Raises CommitConflict where
    another commit landed one of these partitions meanwhile: nothing of this one is in the table
    then. ``marks``: other application transactions (app id -> version) to commit with it;
    ``info``: the commit's custom metadata (its history says who wrote it). ``base``: the snapshot
    the caller decided from (which offsets had landed), a DeltaTable, or `NO_TABLE` (what
    `open_table` gave as None); the commit is checked against every commit after it, so a worker
    that decided on a stale view fails instead of landing twice. None: the table as it is now (a
    commit nothing was decided for, such as the ledger's). On local disk the new commit
    and its files are fsync'd before returning, so a Kafka offset commit after it never gets ahead
    of the lake on a power cut (an object store's PUT is durable when it returns)."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    from deltalake.exceptions import CommitFailedError

    store = store_of(root)
    before = base if base is not None else (open_table(store, dataset) or NO_TABLE)
    if before is NO_TABLE:  # decided on no table: version 0, created empty by whoever comes first
        if not migrating:
            check_layout(store, dataset)
        before = _create(store, rows.schema, dataset)
    txns = [Transaction(app_id=app_id(c), version=int(v)) for c, v in (offsets or {}).items()]
    txns += [Transaction(app_id=k, version=int(v)) for k, v in (marks or {}).items()]
    try:
        write_deltalake(before, rows, mode="append",
                        partition_by=PARTITIONS[dataset] or None, writer_properties=_writer_properties(rows.schema),
                        schema_mode="merge",  # a column a newer release adds joins the table's schema
                        commit_properties=CommitProperties(app_transactions=txns, custom_metadata=info))
    except CommitFailedError as err:
        raise CommitConflict(f"{dataset}: {err}") from None
    after = open_table(store, dataset)
    if store.local:
        _fsync_commits(Path(store.table_uri(dataset)), -1 if before.version() == 0 else before.version(),
                       after.version())
    return after.version()


def _create(store: TableStore, schema: pa.Schema, dataset: str):
    """The table at version 0, empty: a commit of data is never a table's first, so two writers
    that both found no table are checked against each other like any two (the second's offsets
    conflict with the first's, its data never lands beside them). No retry: delta-rs retries a
    create that lost the race for version 0 as a second CREATE TABLE at version 1 (measured on S3),
    a metadata change that every append decided from version 0 then conflicts with."""
    from deltalake import CommitProperties, DeltaTable

    uri, options = store.table_uri(dataset), store.storage_options
    try:
        DeltaTable.create(uri, schema=schema, partition_by=PARTITIONS[dataset] or None, mode="ignore",
                          storage_options=options, commit_properties=CommitProperties(max_commit_retries=0))
    except Exception:  # noqa: BLE001 - another writer created it that instant: read theirs
        if not DeltaTable.is_deltatable(uri, storage_options=options):
            raise
    return DeltaTable(uri, version=0, storage_options=options)


def _fsync_commits(path: Path, after: int, through: int) -> None:
    """fsync the data files the commits (after, through] added, their folders and the log entries
    (delta-rs's local store renames into place without fsync)."""
    log, dirs = path / "_delta_log", set()
    for version in range(after + 1, through + 1):
        entry = log / f"{version:020d}.json"
        for line in entry.read_text().splitlines():
            add = json.loads(line).get("add")
            if add:
                data = path / unquote(add["path"])
                with open(data, "rb") as f:
                    os.fsync(f.fileno())
                dirs.add(data.parent)
        with open(entry, "rb") as f:
            os.fsync(f.fileno())
    for d in dirs | {log}:
        fsync_dir(d)


def data_in(table, where: list[tuple]):
    """The data files of ``table`` (a DeltaTable) in the partitions ``where`` selects, as an Arrow
    dataset (None: there are none); on an object store read through delta-rs's file system."""
    import pyarrow.dataset as ds

    paths = table.file_uris(file_pruning_predicate=where)
    if not paths:
        return None
    data = ds.dataset(paths, format="parquet") if table.table_uri.startswith("file://") else \
        table.to_pyarrow_dataset(file_pruning_predicate=where)
    # a file a Delta delete rewrote (`tracerl forget`) stores strings as string_view, which many
    # Arrow kernels lack (filter, is_in): read every string column as a plain string
    views = [i for i, f in enumerate(data.schema) if f.type == pa.string_view()]
    if not views:
        return data
    schema = pa.schema([f.with_type(pa.string()) if i in views else f for i, f in enumerate(data.schema)])
    return ds.dataset(paths, format="parquet", schema=schema) if table.table_uri.startswith("file://") else \
        table.to_pyarrow_dataset(file_pruning_predicate=where).replace_schema(schema)


def vacuum(root: Where, dataset: str, older_than_hours: int = 24) -> list[str]:
    """Delete the data files no commit names that are older than ``older_than_hours``: what a
    writer killed between writing its files and committing them left behind (never read: readers
    take the table's file list), and the files of rows a delete removed (the reward stage's old
    open-state snapshots). The age keeps the files of a commit in flight and those a reader of an
    older version may still open. The files deleted (none before the first commit)."""
    table = open_table(root, dataset)
    if table is None:
        return []
    return table.vacuum(retention_hours=older_than_hours, dry_run=False, enforce_retention_duration=False,
                        full=True)


def version(root: Where, dataset: str) -> int:
    """The dataset's current version; -1 before its first commit."""
    table = open_table(root, dataset)
    return -1 if table is None else table.version()


def files(root: Where, dataset: str, after: int | None = None,
          where: list[tuple] | None = None) -> tuple[int, list[str]]:
    """(the current version, the data files of the table at it), or with ``after`` only the files
    added since version ``after`` (the lake only appends: no compaction rewrites a file); ``where``:
    only those of the partitions it selects (delta-rs tuple filters, ``[("tenant", "=", t)]``)."""
    table = open_table(root, dataset)
    if table is None:
        check_layout(root, dataset)
        return -1, []
    now = set(table.file_uris(file_pruning_predicate=where))
    if after is not None and after >= 0:
        now -= set(open_table(root, dataset, version=min(after, table.version())).file_uris(
            file_pruning_predicate=where))
    return table.version(), sorted(now)


def relative(root: Where, dataset: str, uris: Iterable[str]) -> list[str]:
    """``uris`` (from `files`) as paths inside the table: what a reader records of what it read, so
    the record holds wherever the lake is mounted or named."""
    base = store_of(root).table_uri(dataset).rstrip("/") + "/"
    return [u[len(base):] if u.startswith(base) else u for u in uris]


def files_since(root: Where, dataset: str, read: set[str] | None, after: int) -> tuple[int, list[str], list[str]]:
    """(the current version, its data files not in ``read``, every data file of it as `relative`
    paths). ``read``: the `relative` paths a reader has read so far (the lake only appends, so the
    rest are new), exact however old the reader's last read is. None: only the version it read
    through is known (``after``, -1 for none), which needs that version's log entries, and Delta
    keeps them for ``delta.logRetentionDuration`` (30 days by default), then drops them at a
    checkpoint: a reader that records ``read`` from then on never needs them again."""
    version, uris = files(root, dataset)
    paths = relative(root, dataset, uris)
    if read is None:  # by version: the files of the table at ``after`` are the ones read
        read = set(relative(root, dataset, open_table(root, dataset, version=min(after, version)).file_uris())) \
            if after >= 0 and version >= 0 else set()
    return version, [u for u, p in zip(uris, paths) if p not in read], paths


def scan(con, root: Where, dataset: str, paths: list[str], name: str) -> str:
    """SQL for a DuckDB relation over data files of ``dataset`` (from `files`), with its partition
    columns typed (``date`` a DATE). Local files: DuckDB's own read_parquet. On an object store
    DuckDB reads them through an Arrow dataset on delta-rs's file system (registered on ``con`` as
    ``name``), with the table's credentials; DuckDB needs no extension of its own for S3."""
    store = store_of(root)
    if store.local:
        if not PARTITIONS[dataset]:
            return f"read_parquet({paths!r}, hive_partitioning = false, union_by_name = true)"
        sql = {"tenant": "VARCHAR", "date": "DATE", "snapshot": "VARCHAR"}  # quoted: never read as a column
        types = ", ".join(f"'{k}': '{sql[k]}'" for k in PARTITIONS[dataset])
        return (f"read_parquet({paths!r}, hive_partitioning = true, "
                f"hive_types = {{{types}}}, union_by_name = true)")
    import pyarrow.dataset as ds
    from deltalake.fs import DeltaStorageHandler
    from pyarrow.fs import PyFileSystem

    base = store.table_uri(dataset) + "/"
    fs = PyFileSystem(DeltaStorageHandler(base, store.storage_options))
    kinds = {k: PARTITION_TYPES[k] for k in PARTITIONS[dataset]}
    hive = ds.HivePartitioning(pa.schema(list(kinds.items()))) if kinds else None
    table = open_table(store, dataset)
    schema = table.schema().to_arrow() if table is not None else None
    data = ds.dataset([p[len(base):] for p in paths], filesystem=fs, format="parquet", partitioning=hive,
                      schema=_with_partitions(schema, kinds) if schema is not None else None)
    con.register(name, data)
    return name


def _with_partitions(schema, kinds: dict) -> pa.Schema:
    """The table's schema with its partition columns typed as the views read them (the newest
    schema: older files lack a column a newer release added, which reads NULL)."""
    schema = pa.schema(schema)
    for key in kinds:
        i = schema.get_field_index(key)
        schema = schema.set(i, pa.field(key, kinds[key])) if i >= 0 else schema.append(pa.field(key, kinds[key]))
    return schema


LOG_FILE = re.compile(r"^(\d{20})\.(json|crc|checkpoint(\.\d+\.\d+)?\.parquet)$")  # a `_delta_log` entry


def table_fs(root: Where, dataset: str):
    """``dataset``'s folder as a pyarrow file system (local or object store, delta-rs's own)."""
    import pyarrow.fs as pafs
    from deltalake.fs import DeltaStorageHandler

    store = store_of(root)
    return pafs.PyFileSystem(DeltaStorageHandler(store.table_uri(dataset), store.storage_options))


def expire_log(root: Where, dataset: str, grace: timedelta = timedelta(0), below: int | None = None) -> int:
    """Checkpoint ``dataset``, then delete its log entries and checkpoints before that checkpoint
    (before ``below`` if given) that are older than ``grace``: their ``add`` entries' column
    statistics quote values of the rows a delete removed (`tracerl forget`, retention). Time travel
    to before the checkpoint ends with them. The files deleted."""
    import pyarrow.fs as pafs

    table = open_table(root, dataset)
    if table is None:
        return 0
    fs, settled = table_fs(root, dataset), datetime.now(timezone.utc) - grace

    def old(before: int) -> list[str]:
        infos = fs.get_file_info(pafs.FileSelector("_delta_log", allow_not_found=True))
        found = [(LOG_FILE.match(i.base_name), i) for i in infos if i.type == pafs.FileType.File]
        return [i.path for m, i in sorted(found, key=lambda f: f[1].base_name)
                if m and int(m.group(1)) < before and (i.mtime is None or i.mtime <= settled)]

    if below is not None and not old(below):
        return 0
    table.create_checkpoint()
    gone = old(table.version())
    for path in gone:
        fs.delete_file(path)
    return len(gone)
