"""The closed loop's report: a table per iteration, PNG plots, and an MLflow run holding both.

Pure records and rendering; the figures come from each iteration's Dagster run (assets/demo.py)."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines.config import TracerlConfig

STAGES = ("traffic", "ingest", "rewards", "train", "gate", "swap")


@dataclass
class IterationReport:
    """One iteration as the demo reports it: its traffic (before the Dagster run) and the run."""

    iteration: int
    champion_before: int
    live_reward: float                # traffic of this iteration, served by champion_before
    requests: int
    failed_requests: int
    stage_s: dict[str, float] = field(default_factory=dict)
    candidate: int | None = None      # adapter version trained this iteration
    outcome: str = "no_candidate"     # promote | reject | hold | contaminated | error | no_candidate | failed
    reasons: list[str] = field(default_factory=list)
    eval_candidate: float | None = None
    eval_champion: float | None = None
    champion_after: int | None = None
    swap_requests: int = 0            # requests the swap-probe users sent during `deployment`
    swap_failed: int = 0
    freshness_s: float | None = None  # first trace of this traffic -> the `deployment` step that swapped ended
    train_metrics: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""                  # the Dagster run of this iteration


def champion_eval(r: IterationReport) -> float | None:
    """The primary eval score of whoever is champion after the iteration."""
    if r.outcome == "promote":
        return r.eval_candidate
    return r.eval_champion


def format_report(reports: list[IterationReport], final_reward: float | None, final_version: int | None) -> str:
    lines = ["", "tracerl closed loop: report", "",
             "iter  served-by  live-reward  candidate  gate      eval cand/champ  champion  swap fails  freshness_s",
             "----  ---------  -----------  ---------  --------  ---------------  --------  ----------  -----------"]
    for r in reports:
        ev = (f"{r.eval_candidate:.3f}/{r.eval_champion:.3f}" if r.eval_candidate is not None else "-")
        swap = f"{r.swap_failed}/{r.swap_requests}" if r.swap_requests else "-"
        lines.append(f"{r.iteration:>4}  v{r.champion_before:<8}  {r.live_reward:>11.3f}  "
                     f"{('v' + str(r.candidate)) if r.candidate else '-':>9}  {r.outcome:<8}  {ev:>15}  "
                     f"{('v' + str(r.champion_after)) if r.champion_after else '-':>8}  {swap:>10}  "
                     f"{r.freshness_s if r.freshness_s is not None else '-':>11}")
    if final_reward is not None:
        lines.append(f"   *  v{final_version:<8}  {final_reward:>11.3f}  (traffic after the last iteration)")
    lines += ["", "gate decisions:"]
    for r in reports:
        run = f" (Dagster run {r.run_id[:8]})" if r.run_id else ""
        lines.append(f"  iteration {r.iteration}{run}: {r.outcome}: {'; '.join(r.reasons)[:400]}")
    lines += ["", "seconds per stage:"]
    for r in reports:
        lines.append(f"  iteration {r.iteration}: " + ", ".join(f"{s} {r.stage_s.get(s, 0):.0f}" for s in STAGES)
                     + f" (total {sum(r.stage_s.values()):.0f})")
    fails = sum(r.swap_failed for r in reports)
    fresh = [r.freshness_s for r in reports if r.freshness_s is not None]
    lines += ["", f"promotions {sum(r.outcome == 'promote' for r in reports)}, "
                  f"rejections {sum(r.outcome in ('reject', 'contaminated') for r in reports)}; "
                  f"failed requests during swaps: {fails} of {sum(r.swap_requests for r in reports)}",
              "freshness (first trace of an iteration -> an adapter trained on it serving): "
              + (f"mean {statistics.mean(fresh):.0f}s, max {max(fresh):.0f}s" if fresh else "no promotion")]
    return "\n".join(lines)


LIKED_SHARE = "liked share (simulated users)"
CANDIDATE_OFFSET = 0.1


def plot(reports: list[IterationReport], final_reward: float | None, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    its = [r.iteration for r in reports]
    live = [r.live_reward for r in reports]
    if final_reward is not None:
        its, live = its + [len(reports) + 1], live + [final_reward]
    paths = []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(its, live, marker="o")
    # the simulated users' liked share, in [0, 1]: not the reward spec's mean turn reward that the
    # learner runs plot by serving version (docs/rewards.md names both)
    ax.set(xlabel="iteration (traffic served by that iteration's champion)", ylabel=LIKED_SHARE,
           title=f"{LIKED_SHARE.capitalize()} per iteration", xticks=its)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out_dir / "live_reward.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    pts = [(r.iteration, champion_eval(r)) for r in reports if champion_eval(r) is not None]
    cand = [(r.iteration, r.eval_candidate) for r in reports if r.eval_candidate is not None]
    # a promoted candidate is the champion after the gate: the same score at the same iteration, so
    # the candidate is drawn a little to the right, dashed with open squares, and stays visible
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="champion after the gate")
    if cand:
        ax.plot([p[0] + CANDIDATE_OFFSET for p in cand], [p[1] for p in cand], marker="s", markerfacecolor="white",
                linestyle="--", label="candidate (drawn just right)")
    ax.set(xlabel="iteration", ylabel="private eval score (primary suite)", title="Eval score per iteration",
           xticks=[r.iteration for r in reports])
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "eval_score.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def log_to_mlflow(cfg: TracerlConfig, reports: list[IterationReport], text: str, plots: list[Path],
                  params: dict[str, Any], final_reward: float | None) -> str:
    import mlflow

    from pipelines import tracking

    with tracking.run(cfg, "closed loop", tags={"tracerl.stage": "loop"}, params=params) as run:
        for r in reports:
            metrics = {"live_reward": r.live_reward, "failed_requests": r.failed_requests,
                       "swap_failed_requests": r.swap_failed, "promoted": float(r.outcome == "promote"),
                       **{f"stage_s.{k}": v for k, v in r.stage_s.items()}}
            if champion_eval(r) is not None:
                metrics["champion_eval"] = champion_eval(r)
            if r.freshness_s is not None:
                metrics["freshness_s"] = r.freshness_s
            mlflow.log_metrics(metrics, step=r.iteration)
        if final_reward is not None:
            mlflow.log_metric("live_reward", final_reward, step=len(reports) + 1)
        for p in plots:
            mlflow.log_artifact(str(p), "plots")
        mlflow.log_text(text, "report.txt")
        mlflow.log_text(json.dumps([asdict(r) for r in reports], indent=1, default=str), "iterations.json")
        return run.info.run_id
