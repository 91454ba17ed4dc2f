"""Reference logprobs kept beside the turns: log π_base(token) for each output token of a turn.

The learner's KL leash and KTO's reference term need them. They depend only on the turn's token
ids, the base model and the forward's precision, never on the adapter being trained, so each
turn's are computed once (on first use, or ahead of training: ``pipelines/train/reference.py``)
and read afterwards, by replays and later iterations. A row is used only when all three match:
``ids_digest`` covers the prompt and output ids, so a re-tokenized turn never reads a stale row.
Rows commit to a Delta table (`delta.py`, whole or not at all, beside the ledger where `[tables]`
puts them); the newest row of a key wins. Schema: ``tables.REFERENCE_SCHEMA``, by tenant.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import duckdb
import pyarrow as pa

from pipelines.lake import delta
from pipelines.lake.delta import REFERENCE
from pipelines.lake.tables import REFERENCE_SCHEMA

__all__ = ["REFERENCE", "Reference", "ReferenceKey", "ids_digest", "read_reference", "record_reference"]


def ids_digest(prompt_ids: Sequence[int], output_ids: Sequence[int]) -> str:
    """sha256 of the ids a reference was computed on (prompt | output)."""
    h = hashlib.sha256()
    h.update(",".join(map(str, prompt_ids)).encode())
    h.update(b"|")
    h.update(",".join(map(str, output_ids)).encode())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class ReferenceKey:
    """What a stored reference was computed with; rows of another key are never read."""

    base_model_hash: str
    precision: str           # the forward's autocast: "fp32" or "bf16" (pipelines/train/device.py)


@dataclass(frozen=True)
class Reference:
    ids_digest: str
    logprobs: list[float]    # one per output token, in order


def read_reference(tables: delta.Where, tenant: str, task: str, key: ReferenceKey,
                   turn_ids: Iterable[str]) -> dict[str, Reference]:
    """The stored references of these turns under ``key`` (turns without one are absent)."""
    wanted = sorted(set(turn_ids))
    if not wanted:
        return {}
    _, paths = delta.files(tables, REFERENCE, where=[("tenant", "=", tenant)])
    if not paths:
        return {}
    con = duckdb.connect()
    try:
        con.register("wanted", pa.table({"turn_id": wanted}))
        rows = con.execute(
            f"SELECT turn_id, ids_digest, logprobs FROM {delta.scan(con, tables, REFERENCE, paths, '_reference')} "
            "WHERE task = ? AND base_model_hash = ? AND precision = ? AND turn_id IN (SELECT turn_id FROM wanted) "
            "QUALIFY row_number() OVER (PARTITION BY turn_id ORDER BY computed_at DESC) = 1",
            [task, key.base_model_hash, key.precision]).fetchall()
    finally:
        con.close()
    return {t: Reference(d, list(lp)) for t, d, lp in rows}


def record_reference(tables: delta.Where, tenant: str, task: str, key: ReferenceKey,
                     refs: dict[str, Reference], run: str) -> int:
    """Commit these references (one row per turn); returns the rows written. ``run`` names the
    learner step that computed them (a commit property, for the table's history)."""
    if not refs:
        return 0
    now = int(time.time() * 1000)
    ids = sorted(refs)
    table = pa.table({"task": [task] * len(ids), "turn_id": ids,
                      "base_model_hash": [key.base_model_hash] * len(ids), "precision": [key.precision] * len(ids),
                      "ids_digest": [refs[t].ids_digest for t in ids], "logprobs": [refs[t].logprobs for t in ids],
                      "computed_at": [now] * len(ids), "tenant": [tenant] * len(ids)},
                     schema=REFERENCE_SCHEMA.append(pa.field("tenant", pa.string())))
    delta.append(tables, REFERENCE, table, info={"tracerl.run": f"reference-{tenant}-{task}-{run}"})
    return len(ids)
