"""Eval items are never trained on: the learner drops matching turns; the gate re-checks.

A turn matches an eval item when its normalized input messages hash equal to the item's
(``hashing.prompt_hash``), or its last user message equals the item's last user message
(``hashing.last_user_hash``: the same question under another system prompt).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from pipelines.evals.suites import Suite, load_suites
from pipelines.evals.hashing import last_user_hash, prompt_hash

T = TypeVar("T")


class ContaminationError(RuntimeError):
    """Training data of the candidate (or its ancestors) contains eval prompts."""


@dataclass(frozen=True)
class EvalHashes:
    prompts: frozenset[str]
    user_messages: frozenset[str]

    def __len__(self) -> int:
        return len(self.prompts)

    def matches(self, messages: list[dict[str, Any]]) -> str | None:
        """The matching hash (what may be logged), or None."""
        h = prompt_hash(messages)
        if h in self.prompts:
            return h
        u = last_user_hash(messages)
        return u if u is not None and u in self.user_messages else None


def hashes_of(suites: Iterable[Suite]) -> EvalHashes:
    items = [i for s in suites for i in s.items]
    return EvalHashes(frozenset(i.hash for i in items),
                      frozenset(h for h in (last_user_hash(i.messages) for i in items) if h))


def eval_hashes(suites_dir: str | Path, tenant: str, task: str) -> EvalHashes:
    """Hashes of every eval prompt of tenant/task (empty when it has no suites)."""
    return hashes_of(load_suites(suites_dir, tenant, task))


def exclude_eval_turns(turns: list[T], hashes: EvalHashes,
                       messages: Callable[[T], list[dict[str, Any]]] = lambda t: t.input_messages,
                       ) -> tuple[list[T], list[T]]:
    """(kept, excluded): the learner trains on ``kept`` only. Order is preserved."""
    kept, excluded = [], []
    for t in turns:
        (excluded if hashes.matches(messages(t)) else kept).append(t)
    return kept, excluded


def find_contamination(prompts: Iterable[list[dict[str, Any]]], hashes: EvalHashes) -> list[str]:
    """Hashes of eval items found among training prompts (sorted, deduplicated)."""
    return sorted({h for p in prompts if (h := hashes.matches(p))})


def trained_prompts(cfg: Any, tenant: str, task: str, adapter_versions: list[int]) -> list[list[dict[str, Any]]]:
    """Input messages of every turn the ``trained_turns`` ledger credits to these adapter versions
    (the candidate and its ancestors): what the gate checks for contamination."""
    import json

    import pyarrow as pa

    from pipelines.lake.query import connect
    from pipelines.lake.ledger import has_ledger, ledger_source

    if not adapter_versions or not has_ledger(cfg.table_store):
        return []  # no ledger yet: nothing was trained
    con = connect(cfg.lake, cfg.table_store)
    con.register("_versions", pa.table({"v": pa.array(adapter_versions, pa.int64())}))
    rows = con.execute(f"""
        SELECT DISTINCT t.input_messages::VARCHAR FROM turns t
        WHERE t.tenant = ? AND t.task = ? AND t.turn_id IN (
            SELECT l.turn_id FROM {ledger_source(con, cfg.table_store)} AS l
            WHERE l.tenant = ? AND l.task = ? AND l.adapter_version IN (SELECT v FROM _versions))""",
                       [tenant, task, tenant, task]).fetchall()
    return [json.loads(r[0]) for r in rows]
