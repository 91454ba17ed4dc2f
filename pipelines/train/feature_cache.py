"""The reward model's turn features, computed once (#41): a turn's features under one base model and
one feature recipe never change, so each learner iteration computes only the turns it has not seen.

Kept by (tenant, task, base model hash, recipe, turn) in ``<home>/reward_model/features.sqlite``,
as float32 bytes. Why SQLite, like the judge's verdict cache, and not a Delta table like the
reference logprobs (`pipelines/lake/reference.py`): only the learner that computed them reads them
(replays on other machines do not), losing them costs a recomputation only, and two learners of
different targets may write at once, which SQLite serializes (WAL, a lock timeout) without a new
dataset and schema in the lake nor a commit per iteration.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from pipelines.config import TracerlConfig


def cache_path(cfg: TracerlConfig) -> Path:
    return cfg.home / "reward_model" / "features.sqlite"


class FeatureCache:
    """Features by (tenant, task, base model hash, recipe, turn id)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.con = sqlite3.connect(path, timeout=30)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("""CREATE TABLE IF NOT EXISTS features (tenant TEXT, task TEXT, base TEXT, recipe INTEGER,
                            turn_id TEXT, x BLOB, computed_at REAL,
                            PRIMARY KEY (tenant, task, base, recipe, turn_id))""")

    def get(self, tenant: str, task: str, base: str, recipe: int, turn_ids: Sequence[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        ids = sorted(set(turn_ids))
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            rows = self.con.execute(f"SELECT turn_id, x FROM features WHERE tenant = ? AND task = ? AND base = ? "
                                    f"AND recipe = ? AND turn_id IN ({','.join('?' * len(part))})",
                                    [tenant, task, base, recipe, *part])
            out.update((t, np.frombuffer(x, dtype=np.float32)) for t, x in rows.fetchall())
        return out

    def put(self, tenant: str, task: str, base: str, recipe: int, features: dict[str, np.ndarray]) -> None:
        now = time.time()
        with self.con:
            self.con.executemany("INSERT OR REPLACE INTO features VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 [(tenant, task, base, recipe, t, np.asarray(x, dtype=np.float32).tobytes(), now)
                                  for t, x in features.items()])

    def close(self) -> None:
        self.con.close()
