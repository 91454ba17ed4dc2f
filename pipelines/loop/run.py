"""One turn of the closed loop, stage by stage, timed: what `make demo` and `bench/loop.py` run.

    traffic (simulated users -> gateway -> vLLM; turns + feedback -> Kafka)
      -> ingest (Kafka -> Parquet lake, exactly once) -> rewards (settled per-turn rewards)
      -> learner (candidate adapter from the champion) -> gate (private evals, candidate vs
         champion in vLLM) -> hot swap (the gateway serves the new champion)

The stages are the same library calls the Dagster assets make (assets/), run in one
process so a newcomer watches one turn end to end. Freshness is measured from the first
trace of the iteration's traffic to the moment the adapter trained on it serves.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from pipelines.config import TracerlConfig
from pipelines.sim.traffic import TrafficConfig, TrafficStats, simulate

SIM_REWARD_SPEC = Path(__file__).resolve().parents[1] / "sim" / "rewards.toml"
STAGES = ("traffic", "ingest", "rewards", "train", "gate", "swap")


@dataclass
class LoopConfig:
    tenant: str = "acme"
    task: str = "concise"
    iterations: int = 3
    traffic: TrafficConfig = field(default_factory=TrafficConfig)
    preference_max_tokens: int | None = None  # concise family only: its token budget (None: 40)
    swap_probe_users: int = 4         # users sending requests while the swap happens
    reward_spec: str = str(SIM_REWARD_SPEC)

    def preference(self) -> Any:
        """The simulated users' hidden preference: the task's family (sim/families.py), else concise."""
        from pipelines.sim.families import family_for_task

        fam = family_for_task(self.task)
        if self.preference_max_tokens is not None and fam.name == "concise":
            fam = dataclasses.replace(fam, max_tokens=self.preference_max_tokens)
        return fam


@dataclass
class IterationReport:
    iteration: int
    champion_before: int
    live_reward: float                # traffic of this iteration, served by champion_before
    requests: int
    failed_requests: int
    stage_s: dict[str, float] = field(default_factory=dict)
    candidate: int | None = None      # adapter version trained this iteration
    outcome: str = "skipped"          # promote | reject | hold | contaminated | skipped
    reasons: list[str] = field(default_factory=list)
    eval_candidate: float | None = None
    eval_champion: float | None = None
    champion_after: int | None = None
    swap_requests: int = 0            # requests sent during the swap window
    swap_failed: int = 0
    freshness_s: float | None = None  # first trace of this traffic -> its adapter serving
    train_metrics: dict[str, Any] = field(default_factory=dict)


class SwapProbe:
    """Users that keep sending requests while a swap runs, counting failures."""

    def __init__(self, url: str, key: str, t: TrafficConfig, pref: Any, users: int):
        self.url, self.key, self.t, self.pref, self.users = url, key, t, pref, users
        self._stop = threading.Event()
        self.requests = self.failed = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(users)]

    def _run(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            t = TrafficConfig(**{**asdict(self.t), "requests": 1, "users": 1, "seed": 7_000_000 + i * 10_000 + n})
            s = simulate(self.url, self.key, t, self.pref)
            with self._lock:
                self.requests += s.requests
                self.failed += s.failed

    def __enter__(self) -> "SwapProbe":
        for th in self._threads:
            th.start()
        time.sleep(0.5)  # requests in flight before the swap starts
        return self

    def __exit__(self, *exc: Any) -> None:
        time.sleep(0.5)  # and after it ends
        self._stop.set()
        for th in self._threads:
            th.join(120)


def _gateway(cfg: TracerlConfig) -> str:
    from pipelines.deploy.service import read_gateway_state

    state = read_gateway_state(cfg)
    if state is None:
        raise RuntimeError("the gateway is not running: `tracerl up` (or `tracerl serve`) first")
    return state.url


def wait_emitted(cfg: TracerlConfig, url: str, timeout: float = 60.0) -> None:
    """Wait until the gateway's emitter has handed every event to Kafka (nothing queued)."""
    from pipelines.deploy.service import admin_key

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        req = urllib.request.Request(f"{url}/admin/stats", headers={"Authorization": f"Bearer {admin_key(cfg)}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            emitter = json.loads(r.read())["emitter"]
        if emitter.get("queued", 0) == 0 and emitter.get("spill_files", 0) == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the gateway's emitter still holds events after {timeout:.0f}s: {emitter}")


def run_iteration(cfg: TracerlConfig, lc: LoopConfig, i: int,
                  progress: Callable[[str, int, int], None] | None = None,
                  log: Callable[[str], None] = print) -> IterationReport:
    from pipelines import registry
    from pipelines.deploy.service import deploy, tenant_key
    from pipelines.gate.run import gate_candidates
    from pipelines.ingest.run import run_ingest
    from pipelines.reward.engine import run_rewards
    from pipelines.reward.spec import load_spec_book
    from pipelines.train.run import run_learner

    url, key = _gateway(cfg), tenant_key(cfg, lc.tenant)
    pref = lc.preference()
    champion = registry.adapter_for_alias(cfg, lc.tenant, lc.task, registry.CHAMPION)
    clock: dict[str, float] = {}

    def timed(stage: str):
        class _T:
            def __enter__(self):
                self.t0 = time.monotonic()

            def __exit__(self, *exc):
                clock[stage] = round(time.monotonic() - self.t0, 1)
        return _T()

    t = TrafficConfig(**{**asdict(lc.traffic), "tenant": lc.tenant, "task": lc.task, "seed": lc.traffic.seed + i})
    with timed("traffic"):
        stats: TrafficStats = simulate(url, key, t, pref,
                                       progress=(lambda d, n: progress("traffic", d, n)) if progress else None)
        wait_emitted(cfg, url)
    report = IterationReport(i, champion or 0, stats.reward, stats.requests, stats.failed)
    log(f"  traffic: {stats.requests} requests ({stats.failed} failed), live reward {stats.reward:.3f}, "
        f"served by {stats.versions}" + (f"; first error: {stats.errors[0][:300]}" if stats.errors else ""))
    with timed("ingest"):
        ing = run_ingest(cfg)
    log(f"  ingest:  {ing.landed} events landed, {ing.quarantined} quarantined, {ing.duplicates} duplicates")
    with timed("rewards"):
        rw = run_rewards(cfg.lake, load_spec_book(lc.reward_spec))
    log(f"  rewards: {rw.settled} turns settled ({rw.provisional} provisional)")
    with timed("train"):
        lr = run_learner(cfg, lc.tenant, lc.task)
    report.train_metrics = {k: lr.metrics.get(k) for k in ("loss", "kl", "reward_mean", "clip_frac", "tokens_per_s")
                            if k in lr.metrics}
    if lr.status != "trained":
        report.reasons = [lr.reason]
        report.stage_s = clock
        log(f"  learner: skipped: {lr.reason}")
        return report
    report.candidate = lr.adapter_version
    log(f"  learner: v{lr.adapter_version} from v{lr.parent_version} on {lr.new_turns} turns "
        f"(kl {lr.metrics.get('kl', float('nan')):.4f})")

    swaps: list[dict[str, Any]] = []

    def hot_swap(tenant: str, task: str, version: int) -> None:
        with SwapProbe(url, key, t, pref, lc.swap_probe_users) as probe:
            t0 = time.monotonic()
            swaps.append(deploy(cfg, tenant, task, version, who="loop"))
            clock["swap"] = round(time.monotonic() - t0, 1)
        report.swap_requests, report.swap_failed = probe.requests, probe.failed
        report.freshness_s = round(time.time() - stats.started_at, 1)

    t_gate = time.monotonic()
    [g] = gate_candidates(cfg, [{"tenant": lc.tenant, "task": lc.task, "registry_version": lr.registry_version}],
                          deploy=hot_swap)
    clock["gate"] = round(time.monotonic() - t_gate - clock.get("swap", 0.0), 1)
    report.outcome, report.reasons = g["outcome"], g["reasons"]
    primary = next((s for s in g.get("suites", {}).values() if s["role"] == "primary"), None)
    if primary:
        report.eval_candidate, report.eval_champion = primary["candidate"], primary["champion"]
    report.champion_after = registry.adapter_for_alias(cfg, lc.tenant, lc.task, registry.CHAMPION)
    report.stage_s = clock
    log(f"  gate:    {g['outcome']}: {'; '.join(g['reasons'])[:300]}")
    if swaps:
        log(f"  swap:    v{report.champion_before} -> v{report.champion_after} in {clock['swap']}s; "
            f"{report.swap_requests} requests during the swap, {report.swap_failed} failed "
            f"(the gateway's count, all users: {sum(s.get('failed_requests') or 0 for s in swaps)} failed of "
            f"{sum(s.get('requests') or 0 for s in swaps)}); "
            f"freshness {report.freshness_s}s")
    return report
