"""Side-by-side replies for the reviewer: what candidate and champion answer to recent real prompts.

The private evals decide; this lets a person judge. A few of the target's most recent production
prompts (distinct, never one matching an eval item: the evals stay private, and a reviewer who
saw them could tune to them) are answered once by each model with the same seed and the gate's
sampling, and scored by the first primary suite's scorer where it can score a reply without a
reference (else the score is empty). The table is logged on the gate run with `mlflow.log_table`
(`gate/side_by_side.json`: MLflow's artifact view shows it as a table, each cell cut to its
column's width, and a click on a cell shows its full text beside the table; a plain JSON file
shows as one long unwrapped line per field instead).
"""

from __future__ import annotations

import json
from typing import Any

from pipelines.config import GateConfig, TracerlConfig
from pipelines.evals.contamination import EvalHashes
from pipelines.evals.hashing import prompt_hash
from pipelines.evals.scorers import score
from pipelines.evals.suites import Item, Suite
from pipelines.gate.evaluate import Backend, Sampling, item_seed
from pipelines.lake.query import connect

MAX_CHARS = 2000  # per cell: a review table, not a transcript store
# what the reviewer reads first comes first: MLflow's table view gives every column the same width
# (a cell's full text opens beside the table on a click); `prompt` is what forget matches rows by
COLUMNS = ("prompt", "candidate", "champion", "candidate_score", "champion_score", "earlier_messages")
ARTIFACT = "gate/side_by_side.json"  # on the gate run; it quotes traffic, so retention deletes it
                                     # with the period (pipelines/rights/retention.py)


def recent_prompts(cfg: TracerlConfig, tenant: str, task: str, n: int, evals: EvalHashes) -> list[list[dict]]:
    """The ``n`` most recent distinct prompts served for tenant/task, none matching an eval item
    (the same test the learner's exclusion uses)."""
    if n <= 0:
        return []
    rows = connect(cfg.lake, cfg.table_store).execute(
        "SELECT input_messages::VARCHAR FROM turns WHERE tenant = ? AND task = ? AND input_messages IS NOT NULL "
        "ORDER BY event_time DESC LIMIT ?", [tenant, task, 50 * n]).fetchall()
    out, seen = [], set()
    for (raw,) in rows:
        messages = json.loads(raw)
        h = prompt_hash(messages)
        if h not in seen and not evals.matches(messages):
            seen.add(h)
            out.append(messages)
        if len(out) == n:
            break
    return out


def _score(suite: Suite | None, text: str, messages: list[dict], judge: Any) -> float | None:
    if suite is None:
        return None
    try:
        return score(suite.scorer, text, Item(messages), judge)
    except ValueError:  # the scorer needs what a real prompt lacks (a reference, a schema)
        return None


def _last_user(messages: list[dict]) -> str:
    text = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
    return str(text)[:MAX_CHARS]


def side_by_side(backend: Backend, candidate: str, champion: str, prompts: list[list[dict]], suite: Suite | None,
                 gate: GateConfig, judge: Any = None) -> dict[str, list[Any]]:
    """Columns for ``mlflow.log_table``: one row per prompt."""
    sampling = Sampling.from_gate(gate)
    cols: dict[str, list[Any]] = {k: [] for k in COLUMNS}
    for messages in prompts:
        seed = item_seed(sampling.seed, prompt_hash(messages), 0)
        a = backend.generate(candidate, messages, sampling, seed)
        b = backend.generate(champion, messages, sampling, seed)
        cols["prompt"].append(_last_user(messages))
        cols["earlier_messages"].append(max(0, len(messages) - 1))
        cols["candidate"].append(a[:MAX_CHARS])
        cols["champion"].append(b[:MAX_CHARS])
        cols["candidate_score"].append(_score(suite, a, messages, judge))
        cols["champion_score"].append(_score(suite, b, messages, judge))
    return cols
