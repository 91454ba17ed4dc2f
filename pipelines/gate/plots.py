"""Eval scores across model versions, as a PNG on the gate run (matplotlib, Agg backend).

Read from the target's gate runs (their `<suite>.candidate` / `<suite>.champion` metrics and
`registry_version` tag; the latest gate of a version counts): per suite, the candidate's mean
(solid, filled circles) and the champion's it was gated against (dashed, open squares, drawn a
little to the right so a candidate that ties the champion does not hide it), on integer version
ticks.
"""

from __future__ import annotations

from typing import Any

from pipelines.adapters.registry import model_name
from pipelines.config import TracerlConfig

SIDES = {  # how each side is drawn: told apart by line, marker and fill as well as by the offset
    "candidate": {"linestyle": "-", "marker": "o", "offset": 0.0, "fill": True},
    "champion": {"linestyle": "--", "marker": "s", "offset": 0.12, "fill": False},
}
SUITE_OFFSET = 0.04  # and each suite a little further right than the one before
MAX_TICKS = 15  # one tick per version up to this many, else integer ticks matplotlib picks


def score_history(cfg: TracerlConfig, tenant: str, task: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """suite -> side ("candidate" | "champion") -> [(registry version, mean)], oldest version first."""
    from pipelines.tracking import client, experiment_id

    runs = client(cfg).search_runs(
        [experiment_id(cfg)], f"tags.`tracerl.stage` = 'gate' AND tags.tenant = '{tenant}' AND tags.task = '{task}'",
        order_by=["attribute.start_time ASC"], max_results=5000)
    latest: dict[int, Any] = {}
    for r in runs:  # oldest first: a version gated again keeps its latest gate
        rv = r.data.tags.get("registry_version", "")
        if rv.isdigit():
            latest[int(rv)] = r.data.metrics
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for rv, metrics in sorted(latest.items()):
        for suite in sorted(k[:-len(".p_gain")] for k in metrics if k.endswith(".p_gain")):
            for side in SIDES:
                if f"{suite}.{side}" in metrics:
                    out.setdefault(suite, {}).setdefault(side, []).append((rv, float(metrics[f"{suite}.{side}"])))
    return out


def history_figure(history: dict[str, dict[str, list[tuple[int, float]]]], title: str):
    """The figure of ``score_history``'s points (closed by the caller)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    versions: set[int] = set()
    for i, (suite, sides) in enumerate(history.items()):
        colour = colours[i % len(colours)]
        for side, style in SIDES.items():
            pts = sides.get(side) or []
            versions |= {v for v, _ in pts}
            dx = style["offset"] + SUITE_OFFSET * i  # suites apart too: two at 1.0 would hide one
            ax.plot([v + dx for v, _ in pts], [y for _, y in pts], color=colour,
                    linestyle=style["linestyle"], marker=style["marker"], markersize=6,
                    markerfacecolor=colour if style["fill"] else "white", label=f"{suite}: {side}")
    if versions:
        ax.set_xlim(min(versions) - 0.5, max(versions) + 0.5)
    if 0 < len(versions) <= MAX_TICKS:
        ax.set_xticks(sorted(versions))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("registry version (champion: the one it was gated against, drawn just right)")
    ax.set_ylabel("private eval score (mean per item)")
    ax.set_title(title)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if history:
        ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    return fig


def log_history_plot(cfg: TracerlConfig, tenant: str, task: str, artifact: str = "gate/scores_by_version.png") -> None:
    import mlflow

    fig = history_figure(score_history(cfg, tenant, task),
                         f"{model_name(tenant, task)}: eval scores by version, candidate vs champion")
    import matplotlib.pyplot as plt  # after history_figure chose the Agg backend

    mlflow.log_figure(fig, artifact)
    plt.close(fig)
