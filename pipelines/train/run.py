"""One learner iteration for one tenant/task, from the lake to a registered candidate.

    settled, labelled turns no adapter trained on (new) + a replay of earlier ones (replay.py)
      -> train_step from the branch head (branch.py): adapter, AdamW state, reward baselines
      -> adapter store v<N+1> (atomic; meta: lineage, branch, replay) -> ledger rows (lake),
         and the reference logprobs computed on the way (lake/reference.py: replays read them)
      -> MLflow run (config, per-step metrics, adapter artifact, lineage and branch tags)
      -> registry model version (the gate decides what it becomes)

The lake's `trained_turns` ledger (pipelines/lake/ledger.py) holds one row per (turn, use): "new"
= no row; a turn replays until it has `learner.replay_max_uses` rows. A row with adapter_version 0
marks a turn excluded as an eval prompt: never trained, never replayed.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipelines.adapters import promote
from pipelines.config import TracerlConfig, gate_config
from pipelines.evals.contamination import eval_hashes, exclude_eval_turns
from pipelines.lake.consent import consented_sql
from pipelines.lake.delta import EVENTS
from pipelines.lake.holdout import held_back_sql
from pipelines.lake.ledger import ledger_source, record_ledger
from pipelines.lake.reference import ReferenceKey, read_reference, record_reference
from pipelines.lake.query import connect
from pipelines.adapters.store import AdapterStore
from pipelines.train.batch import TrainTurn

@dataclass
class LearnerResult:
    tenant: str
    task: str
    status: str                      # "trained" | "skipped"
    reason: str = ""
    new_turns: int = 0
    adapter_version: int | None = None
    parent_version: int | None = None  # what it trained from: the branch head, or the champion
    registry_version: str | None = None
    excluded_eval_turns: int = 0     # prompts matching a private eval item: never trained on
    mlflow_run_id: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    replayed_turns: int = 0          # earlier turns trained again this iteration
    branch_base: int | None = None   # champion adapter version the branch descends from (None = base model)
    branch_depth: int = 0            # 1 = trained from the champion; k = k-th candidate of its branch
    reset_reason: str | None = None  # why the branch head was not continued


def new_training_turns(cfg: TracerlConfig, tenant: str, task: str, limit: int, labelled: bool = True) -> list[TrainTurn]:
    """Settled, labelled turns of tenant/task that no adapter has trained on, oldest first
    (``labelled=False``: the settled turns nobody labelled, for the reward model to label).

    Turns with identical input messages form a group (several samples of one prompt). A turn
    marked ``train = false`` (eval traffic, no consent: ``X-Tracerl-Train: false`` at the
    gateway) is never one of them; it still lands and gets its reward. Nor is a turn whose user
    had not consented to training at its time (pipelines/lake/consent.py: their opt-out, the
    tenant's ``privacy.consent_default``, ``privacy.consent_retroactive``). With ``canary.enabled``,
    neither is a turn of a held-back conversation (pipelines/lake/holdout.py): the off-policy
    estimate reads those.
    """
    holdout = cfg.canary.holdout_share if cfg.canary.enabled else 0.0
    con = connect(cfg.lake, cfg.table_store)
    rows = con.execute(f"""
        SELECT t.turn_id, t.task, t.prompt_token_ids, t.input_messages::VARCHAR, t.output_token_ids,
               t.output_text, t.output_logprobs, r.total, md5(t.input_messages::VARCHAR), t.adapter_version
        FROM turns t JOIN rewards r ON r.tenant = t.tenant AND r.trace_id = t.trace_id AND r.turn_id = t.turn_id
        WHERE r.settled AND r.labelled = ? AND t.train AND t.tenant = ? AND t.task = ?
          AND {consented_sql(con, cfg, tenant)} AND NOT ({held_back_sql(holdout)})
          AND t.turn_id NOT IN (SELECT l.turn_id FROM {ledger_source(con, cfg.table_store)} l WHERE l.tenant = ? AND l.task = ?)
        QUALIFY row_number() OVER (PARTITION BY t.turn_id ORDER BY r.reward_seq DESC) = 1
        ORDER BY t.event_time LIMIT ?""", [labelled, tenant, task, tenant, task, limit]).fetchall()
    return [TrainTurn(turn_id=r[0], task=r[1], prompt_token_ids=r[2], input_messages=json.loads(r[3]),
                      output_token_ids=r[4], output_text=r[5], behaviour_logprobs=r[6], reward=float(r[7] or 0.0),
                      group_id=r[8], adapter_version=r[9]) for r in rows]


def count_new_turns(cfg: TracerlConfig, tenant: str, task: str) -> int:
    return len(new_training_turns(cfg, tenant, task, limit=1_000_000))


def learner_lock(cfg: TracerlConfig, tenant: str, task: str) -> Path:
    """Held (flock) while a learner of tenant/task runs: `tracerl forget` holds every one of the
    tenant's, so no learner reads turns a forget is deleting (pipelines/rights/forget.py)."""
    return Path(cfg.home) / "locks" / "learner" / tenant / f"{task}.lock"


def run_learner(cfg: TracerlConfig, tenant: str, task: str) -> LearnerResult:
    from pipelines.durable import file_lock

    with file_lock(learner_lock(cfg, tenant, task)):
        return _run_learner(cfg, tenant, task)


def _run_learner(cfg: TracerlConfig, tenant: str, task: str) -> LearnerResult:
    import mlflow

    from pipelines import tracking
    from pipelines.adapters import registry
    from pipelines.models.registry import base_model_hash, resolve_base_model
    from pipelines.train.branch import choose_parent
    from pipelines.train.replay import prioritize, replay_pool, use_stats
    from pipelines.train.plots import log_reward_plot
    from pipelines.train.device import place
    from pipelines.train.step import train_step

    # the wall time of each stage, in result.metrics as seconds.<stage> and printed at the end (#41)
    seconds: dict[str, float] = {}
    begun = time.perf_counter()
    clock = [begun]

    def lap(stage: str) -> None:
        now = time.perf_counter()
        seconds[stage] = seconds.get(stage, 0.0) + now - clock[0]
        clock[0] = now

    cfg = cfg.for_target(tenant, task)  # this target's [targets."tenant[/task]"] learner/train/gate settings
    lc = cfg.learner
    canary = promote.canary_version(cfg, tenant, task)
    if canary is not None:  # the two arms a canary compares stay fixed until it is decided
        return LearnerResult(tenant, task, "skipped", reason=f"a canary runs registry version {canary.version} "
                                                             f"(`tracerl canary status`): learning resumes when it ends")
    hashes = eval_hashes(gate_config(cfg).suites_dir, tenant, task)
    turns = new_training_turns(cfg, tenant, task, limit=lc.max_turns)
    # Private evals are never trained on: drop turns whose prompt matches an eval item, and
    # ledger them (version 0) so they are not "new" again, nor replayed, on the next run.
    turns, excluded = exclude_eval_turns(turns, hashes)
    if excluded:
        record_ledger(cfg.table_store, tenant, task, [t.turn_id for t in excluded], 0)
    result = LearnerResult(tenant, task, "skipped", new_turns=len(turns), excluded_eval_turns=len(excluded))
    if len(turns) < lc.min_new_turns:  # replay alone never triggers a run
        result.reason = f"{len(turns)} new settled turns < learner.min_new_turns={lc.min_new_turns}"
        return result
    base = resolve_base_model(cfg.train.base_model, cfg.home)
    labelled_turns, rm_report, model_turns, judge_report, judge_turns = len(turns), None, [], None, []
    unlabelled_new = len(new_training_turns(cfg, tenant, task, limit=1_000_000, labelled=False))
    if lc.reward_model or cfg.judge.rubric.strip():
        unlabelled, unlabelled_excluded = exclude_eval_turns(
            new_training_turns(cfg, tenant, task, limit=lc.max_turns, labelled=False), hashes)
        if unlabelled_excluded:
            record_ledger(cfg.table_store, tenant, task, [t.turn_id for t in unlabelled_excluded], 0)
        result.excluded_eval_turns += len(unlabelled_excluded)
        lap("select")
        if lc.reward_model:  # the unlabelled turns the reward model labels confidently (labels.py)
            from pipelines.train.labels import model_labelled

            model_turns, rm_report = model_labelled(cfg, tenant, task, base, unlabelled)
            lap("reward_model")
        if cfg.judge.rubric.strip():  # the rubric judge labels what the reward model left (judge.py)
            from pipelines.reward.judge import judge_labelled

            done = {t.turn_id for t in model_turns}
            judge_turns, judge_report = judge_labelled(cfg, tenant, task, [t for t in unlabelled if t.turn_id not in done])
            lap("judge")
        turns = turns + model_turns + judge_turns
        result.new_turns = len(turns)
    # replay: re-checked against today's suites (an item added since the first use leaves the pool)
    pool, replay_excluded = exclude_eval_turns(replay_pool(cfg, tenant, task), hashes, lambda p: p.turn.input_messages)
    replayed = prioritize(pool, lc.replay_turns)
    if replay_excluded:
        record_ledger(cfg.table_store, tenant, task, [p.turn.turn_id for p in replay_excluded], 0)
    result.excluded_eval_turns += len(replay_excluded)
    replay = use_stats(len(turns), replayed)
    batch = turns + [p.turn for p in replayed]

    store = AdapterStore(cfg.adapter_root)
    champion_n = registry.adapter_for_alias(cfg, tenant, task, registry.CHAMPION)

    def registry_tags(adapter_version: int) -> dict[str, str]:
        mv = registry.version_for_adapter(cfg, tenant, task, adapter_version)
        return dict(mv.tags) if mv is not None else {}

    bp = choose_parent(store, tenant, task, champion_n, enabled=lc.branch, max_kl=lc.branch_max_kl,
                       max_depth=lc.branch_max_depth, registry_tags=registry_tags)
    parent_n = bp.parent_version
    base_hash = base_model_hash(base)
    ref_key = ReferenceKey(base_hash, place(cfg.train).precision)
    kept_refs = read_reference(cfg.table_store, tenant, task, ref_key, [t.turn_id for t in batch])
    spec_versions = _spec_versions(cfg, tenant, [t.turn_id for t in batch])
    # the new turns by where their label came from, and the share of the new traffic they are
    from pipelines.train.labels import label_sources

    model_ids = {t.turn_id for t in model_turns}
    judge_ids = {t.turn_id for t in judge_turns}
    by_source = {**label_sources(cfg, tenant, [t.turn_id for t in turns if t.turn_id not in model_ids | judge_ids]),
                 "model": len(model_turns), "judge": len(judge_turns)}
    lap("select")
    started = time.time()
    with tempfile.TemporaryDirectory(dir=cfg.home) as tmp:
        step = train_step(base, bp.parent.path if bp.parent else None, batch, cfg.train, Path(tmp) / "adapter",
                          seed=cfg.train.seed, current_version=parent_n or 0,
                          task_baselines=bp.task_baselines or None, optimizer_state=bp.optimizer_state,
                          reference=kept_refs)
        lap("train_step")
        # the gain the learned reward predicts for this adapter (predicted_gain.py): the gate sets it
        # beside the gain its private evals measure
        gain = None
        if model_turns:
            from pipelines.train.predicted_gain import learner_predicted_gain

            gain = learner_predicted_gain(base, bp.parent.path if bp.parent else None, step.adapter_dir, turns,
                                          model_ids, cfg.train, clip=cfg.canary.offpolicy_clip)
            lap("predicted_gain")
        window = {"turns": len(turns), "replayed_turns": len(replayed), "trained_turns": len(step.turn_ids),
                  # new turns by where their label came from: the reward stage's, or the reward model's
                  "labelled_turns": labelled_turns, "model_labelled_turns": len(model_turns),
                  "judge_labelled_turns": len(judge_turns), "by_source": by_source, "coverage": round(len(turns) / max(1, labelled_turns + unlabelled_new), 4),
                  "excluded_eval_turns": result.excluded_eval_turns,
                  "turn_ids": [t.turn_id for t in turns], "replayed_turn_ids": [p.turn.turn_id for p in replayed],
                  "first_turn": turns[0].turn_id, "last_turn": turns[-1].turn_id}
        tags = {"tenant": tenant, "task": task, "parent_version": parent_n or "base",
                "base_model": cfg.train.base_model, "base_model_hash": base_hash,
                "reward_spec_version": ",".join(spec_versions), **bp.tags()}
        metrics = {**(step.steps[-1] if step.steps else {}),
                   # new + replayed = trained + dropped (trained_sentence says why a turn dropped)
                   "trained_turns": len(step.turn_ids), "dropped_turns": len(batch) - len(step.turn_ids),
                   **{k: v for k, v in replay.items() if k.startswith("replay.")},
                   "labelled_turns": labelled_turns, "model_labelled_turns": len(model_turns),
                   **{f"turns.{k}": v for k, v in by_source.items()}, "coverage": window["coverage"]}
        if rm_report is not None:
            from pipelines.train.labels import report_metrics

            metrics.update(report_metrics(rm_report, len(model_turns)))
            metrics["reward_model.reason"] = rm_report.reason
        if gain is not None:
            metrics.update(gain.metrics())
        if judge_report is not None:
            metrics.update(judge_report.metrics())
            metrics["judge.reason"] = judge_report.reason
        with tracking.run(cfg, f"learner {tenant}/{task}", tags={**tags, "tracerl.stage": "learner"},
                          params={"train": cfg.train.to_dict(), "learner": lc.__dict__}, started=started) as run:
            _log_window(cfg, tenant, task, window, spec_versions)
            for i, m in enumerate(step.steps):
                mlflow.log_metrics({k: float(v) for k, v in m.items() if isinstance(v, (int, float))}, step=i)
            mlflow.log_metrics({k: v for k, v in replay.items() if k.startswith("replay.")})
            mlflow.log_metrics({k: float(metrics[k]) for k in ("trained_turns", "dropped_turns")})
            if rm_report is not None:
                from dataclasses import asdict

                from pipelines.train.labels import report_metrics

                mlflow.log_metrics(report_metrics(rm_report, len(model_turns)))
                mlflow.log_dict(asdict(rm_report), "reward_model.json")  # with the reliability table
            if gain is not None:
                mlflow.log_metrics(gain.metrics())
            if judge_report is not None:
                from dataclasses import asdict

                mlflow.log_metrics(judge_report.metrics())
                mlflow.log_dict(asdict(judge_report), "judge.json")
            mlflow.log_dict({**step.summary, "replay": replay, "branch": bp.meta()}, "summary.json")
            version = store.publish(tenant, task, step.adapter_dir, {
                "parent_version": parent_n, "base_model_hash": base_hash,
                "data_window": window, "reward_spec_version": spec_versions,
                "config": cfg.train.to_dict(), "metrics": step.steps[-1] if step.steps else {},
                "mlflow_run_id": run.info.run_id, "branch": bp.meta(),
                "task_baselines": {str(k): float(v) for k, v in step.task_baselines.items()},
                "optimizer": {"resumed_from": parent_n if bp.optimizer_state else None,
                              "resumed_step": step.summary.get("optimizer_resumed_step", 0.0)},
                "replay": replay,
                # the reward model's numbers, the predicted gain among them (the gate reads it)
                "reward_model": {k.removeprefix("reward_model."): v for k, v in metrics.items()
                                 if k.startswith("reward_model.")}})
            mlflow.log_artifacts(str(version.path), "adapter")
            for p in log_reward_plot(cfg, tenant, task):  # what each serving version earned, as metrics too
                mlflow.log_metric("live_reward_by_version", p.mean, step=p.version)
            lap("publish")
            mlflow.log_metrics({f"seconds.{k}": v for k, v in seconds.items()})  # record's come after the run
            mlflow.set_tags({"adapter_version": version.version,
                             "mlflow.runName": f"learner {tenant}/{task} v{version.version}"})
    # computed once, read by every later use of the turn (replays, later iterations)
    record_reference(cfg.table_store, tenant, task, ref_key, step.reference, f"v{version.version}")
    record_ledger(cfg.table_store, tenant, task, [t.turn_id for t in turns] + [p.turn.turn_id for p in replayed],
                   version.version, [1] * len(turns) + [p.uses + 1 for p in replayed],
                   [t.weight for t in batch])
    result.registry_version = registry.register_candidate(cfg, tenant, task, run.info.run_id, version.version, tags)
    parent = f"v{parent_n}" if parent_n else "the base model"
    registry.describe(cfg, tenant, task, result.registry_version, "Learner", (
        f"Adapter v{version.version}, trained from {parent} by {registry.run_link(cfg, run.info.run_id, 'its learner run')} "
        f"on {len(turns)} new settled turns and {len(replayed)} replayed: "
        f"{trained_sentence(len(batch), len(step.turn_ids), step.summary)}; "
        f"reward spec {', '.join(spec_versions) or 'unknown'}; in {time.time() - started:.0f} s."))
    lap("record")
    seconds["total"] = time.perf_counter() - begun
    metrics.update({f"seconds.{k}": round(v, 3) for k, v in seconds.items()})
    print(f"learner {tenant}/{task} stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items()), flush=True)
    result.status, result.adapter_version, result.parent_version = "trained", version.version, parent_n
    result.mlflow_run_id, result.metrics = run.info.run_id, metrics
    result.replayed_turns, result.branch_base, result.branch_depth = len(replayed), bp.base, bp.depth
    result.reset_reason = bp.reset_reason
    return result


def trained_sentence(batch: int, trained: int, summary: dict[str, Any]) -> str:
    """The learner's counts for its description: "<batch> in all, <trained> trained" and, when some
    dropped, how many and why, from train_step's summary: empty replies (nothing to score), too
    stale (train.staleness gave them weight 0), and the rest carried no
    signal (policy gradient: zero advantage, a reward at its baseline or in a group of equal rewards;
    KTO: a neutral reward). The counts add up: batch = trained + dropped."""
    dropped = batch - trained
    out = f"{batch} in all, {trained} trained"
    if dropped <= 0:
        return out
    empty, stale = int(summary.get("empty_outputs", 0)), int(summary.get("stale_dropped", 0))
    why = [f"{empty} with an empty reply"] if empty else []
    why += [f"{stale} too stale (train.staleness weight 0)"] if stale else []
    rest = dropped - empty - stale
    if rest > 0:
        if "neutral_dropped" in summary:
            why.append(f"{rest} with a neutral reward (KTO needs a thumbs up or down)")
        else:
            kinds = ["a reward at its baseline"] + (["a group whose replies all got the same reward"]
                                                  if summary.get("dropped_uniform") else []) \
                + (["no baseline yet"] if summary.get("dropped_no_baseline") else [])
            why.append(f"{rest} with no advantage ({', or '.join(kinds)})")
    return f"{out}, {dropped} dropped: {'; '.join(why)}"


def _log_window(cfg: TracerlConfig, tenant: str, task: str, window: dict[str, Any], spec_versions: list[str]) -> None:
    """The training window as the run's MLflow dataset input (Datasets in the run page): the lake's
    turns table as source, the digest of the exact turn ids (new and replayed), counts and the
    reward-spec versions as tags. The turns stay in the lake; the input names them."""
    import warnings

    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    ids = "\n".join(window["turn_ids"] + window["replayed_turn_ids"]).encode()
    with warnings.catch_warnings():  # MLflow registers its local-file source twice and warns on every lookup
        warnings.simplefilter("ignore", UserWarning)
        uri = cfg.table_store.table_uri(EVENTS)  # the turns' table, in the lake folder or the bucket
        source = resolve_dataset_source(Path(uri).as_uri() if cfg.table_store.local else uri)
    ds = MetaDataset(source, name=f"lake {tenant}/{task}", digest=hashlib.sha256(ids).hexdigest()[:16])
    mlflow.log_input(ds, context="training", tags={
        "turns": str(window["turns"]), "replayed_turns": str(window["replayed_turns"]),
        "first_turn": window["first_turn"], "last_turn": window["last_turn"],
        "reward_spec_version": ",".join(spec_versions) or "unknown"})


def _spec_versions(cfg: TracerlConfig, tenant: str, turn_ids: list[str]) -> list[str]:
    con = connect(cfg.lake, cfg.table_store)
    con.register("_ids", pa.table({"turn_id": turn_ids}))
    return [r[0] for r in con.execute(
        "SELECT DISTINCT spec_version FROM rewards WHERE settled AND tenant = ? "
        "AND turn_id IN (SELECT turn_id FROM _ids) ORDER BY 1", [tenant]).fetchall()]


def training_targets(cfg: TracerlConfig) -> list[tuple[str, str]]:
    """Every tenant/task that has settled, labelled turns in the lake."""
    con = connect(cfg.lake, cfg.table_store)
    return [tuple(r) for r in con.execute(
        "SELECT DISTINCT tenant, task FROM rewards WHERE settled AND labelled ORDER BY ALL").fetchall()]
