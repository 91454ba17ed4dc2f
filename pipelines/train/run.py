"""One learner iteration for one tenant/task, from the lake to a registered candidate.

    settled, labelled, not-yet-trained turns (DuckDB over the lake)
      -> train_step from the champion adapter (or a fresh one)
      -> adapter store v<N+1> (atomic) -> ledger of trained turns (lake)
      -> MLflow run (config, per-step metrics, adapter artifact, lineage tags)
      -> registry model version (the gate decides what it becomes)

Each turn trains exactly once: the `trained_turns` ledger, committed through the
lake's manifest protocol, is what "new" is measured against.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipelines.config import TracerlConfig
from pipelines.lake.query import connect
from pipelines.lake.store import Lake
from pipelines.train.adapters import AdapterStore
from pipelines.train.batch import TrainTurn

TRAINED_TURNS = "trained_turns"
LEDGER_SCHEMA = pa.schema([("task", pa.string()), ("turn_id", pa.string()),
                           ("adapter_version", pa.int64()), ("trained_at", pa.timestamp("ms", tz="UTC"))])


@dataclass
class LearnerResult:
    tenant: str
    task: str
    status: str                      # "trained" | "skipped"
    reason: str = ""
    new_turns: int = 0
    adapter_version: int | None = None
    parent_version: int | None = None
    registry_version: str | None = None
    excluded_eval_turns: int = 0     # prompts matching a private eval item: never trained on
    mlflow_run_id: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def _ledger_source(lake_root: Path) -> str:
    folder = Path(lake_root).resolve() / TRAINED_TURNS
    if any(folder.rglob("*.parquet")):
        return f"read_parquet('{folder}/**/*.parquet', hive_partitioning = true, hive_types = {{'tenant': VARCHAR}})"
    return ("(SELECT NULL::VARCHAR AS tenant, NULL::VARCHAR AS task, NULL::VARCHAR AS turn_id, "
            "NULL::BIGINT AS adapter_version WHERE false)")


def new_training_turns(cfg: TracerlConfig, tenant: str, task: str, limit: int) -> list[TrainTurn]:
    """Settled, labelled turns of tenant/task that no adapter has trained on, oldest first.

    Turns with identical input messages form a group (several samples of one prompt).
    """
    con = connect(cfg.lake)
    rows = con.execute(f"""
        SELECT t.turn_id, t.task, t.prompt_token_ids, t.input_messages::VARCHAR, t.output_token_ids,
               t.output_text, t.output_logprobs, r.total, md5(t.input_messages::VARCHAR), t.adapter_version
        FROM turns t JOIN rewards r ON r.tenant = t.tenant AND r.trace_id = t.trace_id AND r.turn_id = t.turn_id
        WHERE r.settled AND r.labelled AND t.tenant = ? AND t.task = ?
          AND t.turn_id NOT IN (SELECT l.turn_id FROM {_ledger_source(cfg.lake)} l WHERE l.tenant = ? AND l.task = ?)
        QUALIFY row_number() OVER (PARTITION BY t.turn_id ORDER BY r.reward_seq DESC) = 1
        ORDER BY t.event_time LIMIT ?""", [tenant, task, tenant, task, limit]).fetchall()
    return [TrainTurn(turn_id=r[0], task=r[1], prompt_token_ids=r[2], input_messages=json.loads(r[3]),
                      output_token_ids=r[4], output_text=r[5], behaviour_logprobs=r[6], reward=float(r[7]),
                      group_id=r[8], adapter_version=r[9]) for r in rows]


def count_new_turns(cfg: TracerlConfig, tenant: str, task: str) -> int:
    return len(new_training_turns(cfg, tenant, task, limit=1_000_000))


def _record_ledger(cfg: TracerlConfig, tenant: str, task: str, turn_ids: list[str], version: int) -> None:
    lake = Lake(cfg.lake)
    now = int(time.time() * 1000)
    table = pa.table({"task": [task] * len(turn_ids), "turn_id": turn_ids,
                      "adapter_version": [version] * len(turn_ids), "trained_at": [now] * len(turn_ids)},
                     schema=LEDGER_SCHEMA)
    with lake.locked():
        txn = lake.begin(f"learner-{tenant}-{task}-v{version}")
        txn.stage(TRAINED_TURNS, {"tenant": tenant}, table)
        txn.commit({}, {"trained_turns": len(turn_ids)})
        txn.publish()


def run_learner(cfg: TracerlConfig, tenant: str, task: str) -> LearnerResult:
    import mlflow

    from pipelines import registry, tracking
    from pipelines.models.registry import base_model_hash, resolve_base_model
    from pipelines.train.step import train_step

    from pipelines.gate.config import gate_config
    from pipelines.gate.contamination import eval_hashes, exclude_eval_turns

    lc = cfg.learner
    turns = new_training_turns(cfg, tenant, task, limit=lc.max_turns)
    # Private evals are never trained on: drop turns whose prompt matches an eval item, and
    # ledger them (version 0) so they are not "new" again on the next run.
    turns, excluded = exclude_eval_turns(turns, eval_hashes(gate_config(cfg).suites_dir, tenant, task))
    if excluded:
        _record_ledger(cfg, tenant, task, [t.turn_id for t in excluded], 0)
    result = LearnerResult(tenant, task, "skipped", new_turns=len(turns), excluded_eval_turns=len(excluded))
    if len(turns) < lc.min_new_turns:
        result.reason = f"{len(turns)} new settled turns < learner.min_new_turns={lc.min_new_turns}"
        return result

    store = AdapterStore(cfg.adapter_root)
    parent_n = registry.adapter_for_alias(cfg, tenant, task, registry.CHAMPION)
    parent = store.get(tenant, task, parent_n) if parent_n else None
    base = resolve_base_model(cfg.train.base_model, cfg.home)
    spec_versions = _spec_versions(cfg, tenant, [t.turn_id for t in turns])
    with tempfile.TemporaryDirectory(dir=cfg.home) as tmp:
        step = train_step(base, parent.path if parent else None, turns, cfg.train, Path(tmp) / "adapter",
                          seed=cfg.train.seed, current_version=parent_n or 0)
        window = {"turns": len(turns), "trained_turns": len(step.turn_ids), "excluded_eval_turns": len(excluded),
                  "turn_ids": [t.turn_id for t in turns],
                  "first_turn": turns[0].turn_id, "last_turn": turns[-1].turn_id}
        tags = {"tenant": tenant, "task": task, "parent_version": parent_n or "base",
                "base_model": cfg.train.base_model, "reward_spec_version": ",".join(spec_versions)}
        with tracking.run(cfg, f"learner {tenant}/{task}", tags={**tags, "tracerl.stage": "learner"},
                          params={"train": cfg.train.to_dict(), "learner": lc.__dict__}) as run:
            for i, m in enumerate(step.steps):
                mlflow.log_metrics({k: float(v) for k, v in m.items() if isinstance(v, (int, float))}, step=i)
            mlflow.log_dict(step.summary, "summary.json")
            version = store.publish(tenant, task, step.adapter_dir, {
                "parent_version": parent_n, "base_model_hash": base_model_hash(base),
                "data_window": window, "reward_spec_version": spec_versions,
                "config": cfg.train.to_dict(), "metrics": step.steps[-1] if step.steps else {},
                "mlflow_run_id": run.info.run_id})
            mlflow.log_artifacts(str(version.path), "adapter")
            mlflow.set_tag("adapter_version", version.version)
    _record_ledger(cfg, tenant, task, [t.turn_id for t in turns], version.version)
    result.registry_version = registry.register_candidate(cfg, tenant, task, run.info.run_id, version.version,
                                                          {**tags, "data_turns": len(turns)})
    result.status, result.adapter_version, result.parent_version = "trained", version.version, parent_n
    result.mlflow_run_id, result.metrics = run.info.run_id, step.steps[-1] if step.steps else {}
    return result


def _spec_versions(cfg: TracerlConfig, tenant: str, turn_ids: list[str]) -> list[str]:
    con = connect(cfg.lake)
    con.register("_ids", pa.table({"turn_id": turn_ids}))
    return [r[0] for r in con.execute(
        "SELECT DISTINCT spec_version FROM rewards WHERE settled AND tenant = ? "
        "AND turn_id IN (SELECT turn_id FROM _ids) ORDER BY 1", [tenant]).fetchall()]


def training_targets(cfg: TracerlConfig) -> list[tuple[str, str]]:
    """Every tenant/task that has settled, labelled turns in the lake."""
    con = connect(cfg.lake)
    return [tuple(r) for r in con.execute(
        "SELECT DISTINCT tenant, task FROM rewards WHERE settled AND labelled ORDER BY ALL").fetchall()]
