"""Eval scores across model versions, as a PNG on the gate run (matplotlib, Agg backend)."""

from __future__ import annotations

from pipelines.config import TracerlConfig
from pipelines.adapters.registry import model_name
from pipelines.tracking import client


def score_history(cfg: TracerlConfig, tenant: str, task: str) -> dict[str, list[tuple[int, float]]]:
    """suite -> [(registry version, candidate mean)] from the versions' ``eval.<suite>.candidate`` tags."""
    out: dict[str, list[tuple[int, float]]] = {}
    for mv in client(cfg).search_model_versions(f"name = '{model_name(tenant, task)}'"):
        for k, v in mv.tags.items():
            if k.startswith("eval.") and k.endswith(".candidate"):
                out.setdefault(k[5:-10], []).append((int(mv.version), float(v)))
    return {s: sorted(pts) for s, pts in sorted(out.items())}


def log_history_plot(cfg: TracerlConfig, tenant: str, task: str, artifact: str = "gate/scores_by_version.png") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    history = score_history(cfg, tenant, task)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for suite, pts in history.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=suite)
    ax.set_xlabel("registry version")
    ax.set_ylabel("mean score")
    ax.set_title(f"{model_name(tenant, task)}: eval scores by version")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    mlflow.log_figure(fig, artifact)
    plt.close(fig)
