"""Mean turn reward by serving version, as a PNG on every learner run (the scheduled path's
reward-per-iteration plot: each adapter version that served is one point of the loop).

Read from the lake: the mean settled reward total of the target's turns (the reward spec's scale,
docs/rewards.md: not the simulator's liked share, which only `make demo` reports), by the adapter
version that served them (NULL = the base model, version 0 on the plot), with a 95% interval and
the turn count, on integer version ticks. The gate run's `scores_by_version.png` is its eval-score
counterpart. (The file and metric keep their first name, `live_reward_by_version`.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipelines.config import TracerlConfig
from pipelines.lake.query import connect


@dataclass(frozen=True)
class VersionReward:
    version: int          # adapter version that served (0: the base model)
    mean: float           # mean settled reward total of its turns
    se: float             # standard error of that mean (nan for one turn)
    turns: int


def reward_history(cfg: TracerlConfig, tenant: str, task: str) -> list[VersionReward]:
    """Per serving version, oldest first: settled turns only, each turn's latest reward."""
    rows = connect(cfg.lake, cfg.table_store).execute("""
        WITH latest AS (
            SELECT coalesce(t.adapter_version, 0) AS v, r.total AS total
            FROM turns t JOIN rewards r ON r.tenant = t.tenant AND r.trace_id = t.trace_id AND r.turn_id = t.turn_id
            WHERE r.settled AND r.labelled AND t.tenant = ? AND t.task = ?
            QUALIFY row_number() OVER (PARTITION BY t.turn_id ORDER BY r.reward_seq DESC) = 1)
        SELECT v, avg(total), stddev_samp(total), count(*) FROM latest GROUP BY v ORDER BY v""",
        [tenant, task]).fetchall()
    return [VersionReward(int(v), float(m), float(sd) / math.sqrt(n) if sd is not None and n > 1 else math.nan,
                          int(n)) for v, m, sd, n in rows]


TITLE = "mean turn reward by serving version"
YLABEL = "mean turn reward (settled turns)"


def reward_figure(pts: list[VersionReward], title: str):
    """The figure of ``reward_history``'s points (closed by the caller)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if pts:
        ax.errorbar([p.version for p in pts], [p.mean for p in pts],
                    yerr=[0.0 if math.isnan(p.se) else 1.96 * p.se for p in pts], marker="o", capsize=3)
        for p in pts:
            ax.annotate(f"{p.turns}", (p.version, p.mean), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if 0 < len(pts) <= 15:
        ax.set_xticks([p.version for p in pts])
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="adapter version that served (0 = base model)", ylabel=YLABEL, title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def log_reward_plot(cfg: TracerlConfig, tenant: str, task: str,
                    artifact: str = "learner/live_reward_by_version.png") -> list[VersionReward]:
    """Plot ``reward_history`` into the active MLflow run; the points plotted."""
    import mlflow

    pts = reward_history(cfg, tenant, task)
    fig = reward_figure(pts, f"{tenant}/{task}: {TITLE} (n turns)")
    import matplotlib.pyplot as plt  # after reward_figure chose the Agg backend

    mlflow.log_figure(fig, artifact)
    plt.close(fig)
    return pts
