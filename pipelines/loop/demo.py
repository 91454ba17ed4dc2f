"""`make demo`'s settings and session helpers (no Dagster here: the demo itself is assets/demo.py).

The demo starts the embedded Kafka, vLLM (CPU) and the gateway, bootstraps the first champion,
then K times sends simulated traffic and runs one iteration of the closed-loop Dagster job; the
state lives in the tracerl home (`.tracerl/`), so a second run continues from the champion the
first one left (`--fresh` clears the loop's state first).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.config import TracerlConfig
from pipelines import stack
from pipelines.sim.traffic import TrafficConfig

SIM_REWARD_SPEC = Path(__file__).resolve().parents[1] / "sim" / "rewards.toml"
STATE = ("lake", "adapters", "deploy", "spill", "mlflow.db", "mlartifacts", "reports")  # not models/, not logs/


@dataclass
class LoopConfig:
    """What the demo adds around the job: who the simulated users are and how much they send."""

    tenant: str = "acme"
    task: str = "concise"
    iterations: int = 3
    traffic: TrafficConfig = field(default_factory=TrafficConfig)  # before each iteration's run
    preference_max_tokens: int | None = None  # concise family only: its token budget (None: 40)
    swap_probe_users: int = 4         # users sending requests while `deployment` swaps
    reward_spec: str = str(SIM_REWARD_SPEC)  # the simulated users' spec (settles at session end)

    def preference(self) -> Any:
        """The simulated users' hidden preference: the task's family (sim/families.py), else concise."""
        from pipelines.sim.families import family_for_task

        fam = family_for_task(self.task)
        if self.preference_max_tokens is not None and fam.name == "concise":
            fam = dataclasses.replace(fam, max_tokens=self.preference_max_tokens)
        return fam

    def traffic_for(self, i: int) -> TrafficConfig:
        """Iteration i's traffic: the target's, with its own seed."""
        return TrafficConfig(**{**dataclasses.asdict(self.traffic), "tenant": self.tenant, "task": self.task,
                                "seed": self.traffic.seed + i})


def fresh_start(cfg: TracerlConfig) -> None:
    """Stop what a previous run left and clear its state (the converted model stays cached)."""
    for name in reversed(stack.SERVICES):
        stack.stop(cfg, name)
    for name in STATE:
        p = cfg.home / name
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


class Bar:
    """A one-line progress bar on stderr (tqdm when it is installed)."""

    def __init__(self) -> None:
        self._bars: dict[str, object] = {}
        try:
            from tqdm import tqdm

            self._tqdm = tqdm
        except ImportError:
            self._tqdm = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self._tqdm is None:
            if done == total or done % max(1, total // 10) == 0:
                print(f"    {stage}: {done}/{total}", file=sys.stderr)
            return
        bar = self._bars.get(stage)
        if bar is None:
            bar = self._bars[stage] = self._tqdm(total=total, desc=f"    {stage}", leave=False, file=sys.stderr)
        bar.update(done - bar.n)  # type: ignore[attr-defined]
        if done >= total:
            bar.close()  # type: ignore[attr-defined]
            del self._bars[stage]
