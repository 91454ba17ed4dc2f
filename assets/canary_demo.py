"""`tracerl demo --canary` (`make demo-canary`): live evidence before full promotion (issue #15).

Two candidates meet live traffic before either may take all of it, on the embedded stack and
SmolLM2, with the canary on for the demo's target only (`targets."<tenant>/<task>".canary` over
whatever tracerl.toml says; the shipped default is off, docs/canary.md says why):

1. **A good candidate.** Iterations of `closed_loop_job` (traffic, then ingest -> rewards ->
   learner -> gate -> deployment), as `make demo` runs them, until a candidate passes the offline
   gate and the off-policy estimate: it becomes the registry's `challenger` (status canary) and
   `deployment` starts its canary in the gateway.
2. **A deliberately bad one.** The new champion with a share of its update taken back
   (pipelines/loop/backwards.py: a step back along the update, the way inverted rewards push it),
   gated offline like any candidate (`tracerl gate`). The demo looks for the worst such candidate
   the offline gate cannot call worse than the champion: it tries the shares of
   `CanaryDemoConfig.take_back` in order, largest first, and keeps the first whose one-sided upper
   bound on the primary suite's difference is >= 0 (the gate rejects it only for want of a
   significant gain: it nearly passes), else the last tried. Whatever the gate says, the operator
   starts its canary (`/admin/canary`, what `tracerl canary start` calls): the canary is the line of
   defence for what offline evals miss, so the demo shows it holding.

Each canary then runs in rounds: simulated users' sessions (the gateway splits them, sticky per
conversation); `ingest_job`, `reward_job` and `canary_job` run in process (the jobs the schedules
and the `canary_settling` sensor start), until the step promotes, rolls back or expires. Probe
users send requests during every canary step, so the promotion's swap and the rollback's stop are
measured for failed requests, besides the gateway's own count.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import dagster as dg

from assets.demo import demo_iteration, demo_resource
from assets.driver import dagster_instance, run_job
from assets.resources import TracerlResource
from assets.targets import ensure_target
from pipelines import stack
from pipelines.config import TracerlConfig
from pipelines.loop.demo import Bar, LoopConfig, fresh_start

DECIDED = ("promoted", "rolled_back", "expired", "stopped")


@dataclass(frozen=True)
class CanaryDemoConfig:
    """The canary's settings for the demo's target: half the conversations, so a few hundred
    sessions decide; the sequence tightest near 200 sessions (the shipped 2000 suits a 10% share
    of production traffic). Everything else is the shipped [canary]."""

    share: float = 0.5
    min_sessions: int = 20
    t_opt: int = 200
    max_rounds: int = 12          # canary rounds before the demo stops waiting (the canary goes on)
    take_back: tuple[float, ...] = (0.75, 0.5, 0.3)
    """Shares of the champion's update the bad candidate takes back, tried in order (2 = the whole
    update reversed, 1.5 half of it reversed); the first the offline gate cannot call worse is canaried."""

    def __post_init__(self) -> None:
        from pipelines.loop.backwards import check_take_back

        if not self.take_back:
            raise ValueError("take_back=(): give one or more shares, each > 0 and not 1 (1 is the base model)")
        object.__setattr__(self, "take_back", tuple(check_take_back(k) for k in self.take_back))

    def target_entry(self) -> dict[str, Any]:
        return {"canary": {"enabled": True, "share": self.share, "min_sessions": self.min_sessions,
                           "t_opt": self.t_opt}}


@dataclass
class CanaryRound:
    round: int
    sessions: int
    failed: int                                   # sessions that hit an error
    served: dict[int, int]                        # adapter version -> turns
    liked: float                                  # share of replies the users liked, both arms
    action: str                                   # the canary step's: continue | promoted | ...
    summary: str
    probe_requests: int = 0                       # during the canary step (a swap or a stop, if decided)
    probe_failed: int = 0


@dataclass
class CanaryReport:
    label: str                                    # "good" | "bad"
    challenger: int | None
    champion: int | None
    how: str                                      # how it entered the canary
    rounds: list[CanaryRound] = field(default_factory=list)
    gate: dict[str, Any] | None = None            # the offline gate's summary, when it was gated here
    tried: list[dict[str, Any]] = field(default_factory=list)  # bad candidates gated before this one

    @property
    def action(self) -> str:
        return self.rounds[-1].action if self.rounds else "not started"

    @property
    def failed(self) -> int:
        return sum(r.failed + r.probe_failed for r in self.rounds)


def canary_round(cfg: TracerlConfig, resource: TracerlResource, lc: LoopConfig, n: int,
                 instance: dg.DagsterInstance, log: Callable[[str], None]) -> CanaryRound:
    """One batch of sessions through the split, then ingest, rewards and one canary step (Dagster)."""
    from pipelines.deploy.service import tenant_key
    from pipelines.loop.traffic import SwapProbe, gateway_url, wait_emitted
    from pipelines.sim.traffic import simulate

    url, key, pref, t = gateway_url(cfg), tenant_key(cfg, lc.tenant), lc.preference(), lc.traffic_for(1000 + n)
    stats = simulate(url, key, t, pref)
    wait_emitted(cfg, url)
    tags = {"tracerl/driver": "demo-canary", "tracerl/round": str(n)}
    for job in ("ingest_job", "reward_job"):
        run = run_job(resource, job, instance=instance, tags=tags)
        if not run.success:
            raise RuntimeError(f"{job} failed (Dagster run {run.run_id}): {run.error}")
    probe = SwapProbe(url, key, t, pref, lc.swap_probe_users)
    run = run_job(resource, "canary_job", ensure_target(instance, lc.tenant, lc.task), instance=instance,
                  tags=tags, during={"canary": probe})
    step = run.canary or {}
    r = CanaryRound(n, stats.requests, stats.failed, dict(sorted(stats.versions.items())), round(stats.reward, 3),
                    str(step.get("action") or ("failed" if not run.success else "none")),
                    str(step.get("summary") or run.error or ""), probe.requests, probe.failed)
    log(f"  round {n}: {r.sessions} sessions ({r.failed} failed), liked {r.liked:.3f}, served {r.served}; "
        f"canary step: {r.summary}; probe {r.probe_requests} requests, {r.probe_failed} failed")
    return r


def run_canary(cfg: TracerlConfig, resource: TracerlResource, lc: LoopConfig, dc: CanaryDemoConfig,
               report: CanaryReport, instance: dg.DagsterInstance, log: Callable[[str], None],
               first_round: int = 1) -> CanaryReport:
    for n in range(first_round, first_round + dc.max_rounds):
        report.rounds.append(canary_round(cfg, resource, lc, n, instance, log))
        if report.action in DECIDED or report.action in ("no_canary", "failed"):
            break
    return report


def good_canary(cfg: TracerlConfig, resource: TracerlResource, lc: LoopConfig, dc: CanaryDemoConfig,
                instance: dg.DagsterInstance, log: Callable[[str], None]) -> CanaryReport:
    """Loop iterations until a candidate enters the canary, then its rounds."""
    from pipelines.adapters import promote, registry
    from pipelines.adapters.version import tag_version

    bar = Bar()
    for i in range(1, lc.iterations + 1):
        log(f"[good {i}/{lc.iterations}] traffic, then Dagster {lc.tenant}/{lc.task}: ingest -> rewards -> train "
            "-> gate (+ off-policy estimate) -> deployment (starts a canary)")
        r = demo_iteration(cfg, resource, lc, i, instance, progress=bar, log=log)
        mv = promote.canary_version(cfg, lc.tenant, lc.task)
        if mv is not None:
            champion = registry.adapter_for_alias(cfg, lc.tenant, lc.task, registry.CHAMPION)
            report = CanaryReport("good", tag_version(mv), champion, f"passed the offline gate in loop iteration {i} "
                                  f"({'; '.join(r.reasons)[:300]})")
            log(f"[good] canary: v{report.challenger} vs v{champion} at {dc.share:.0%} of conversations")
            return run_canary(cfg, resource, lc, dc, report, instance, log)
    return CanaryReport("good", None, registry.adapter_for_alias(cfg, lc.tenant, lc.task, registry.CHAMPION),
                        f"no candidate passed the offline gate in {lc.iterations} iterations")


def primary_bounds(summary: dict[str, Any]) -> tuple[float, float, float] | None:
    """(delta, lower, upper bound) of the gate's primary suite, candidate - champion; None if absent."""
    for suite in (summary.get("suites") or {}).values():
        if suite.get("role") == "primary":
            return suite["delta"], suite["low"], suite["high"]
    return None


def nearly_passes(summary: dict[str, Any]) -> bool:
    """The offline gate could not call the candidate worse than the champion: the one-sided upper
    bound of the primary suite's difference is >= 0 (it was rejected, if at all, for want of a gain)."""
    bounds = primary_bounds(summary)
    return summary.get("outcome") == "promote" or (bounds is not None and bounds[2] >= 0)


def gate_line(tried: dict[str, Any]) -> str:
    """One gated bad candidate (an entry of `CanaryReport.tried`), for the log and the report."""
    b = tried["bounds"]
    return (f"take back {tried['take_back']:g} -> v{tried['version']}: {tried['outcome']}"
            + (f", delta {b[0]:+.3f} in [{b[1]:+.3f}, {b[2]:+.3f}]" if b else "")
            + (" (nearly passes)" if tried["nearly_passes"] else ""))


def bad_canary(cfg: TracerlConfig, resource: TracerlResource, lc: LoopConfig, dc: CanaryDemoConfig,
               reverse: int, instance: dg.DagsterInstance, log: Callable[[str], None]) -> CanaryReport:
    """The worst step back from adapter ``reverse`` that the offline gate cannot call worse (of
    ``dc.take_back``, else the last tried), then canaried: by the gate if it passed, else by the operator."""
    from pipelines.adapters import promote, registry
    from pipelines.deploy.service import canary
    from pipelines.gate.run import gate_version
    from pipelines.loop.backwards import describe, publish_backwards

    settings = resource.load()
    tried: list[dict[str, Any]] = []
    for kappa in dc.take_back:
        bad = publish_backwards(settings, lc.tenant, lc.task, reverse, take_back=kappa)
        log(f"[bad] v{bad}: {describe(reverse, kappa)}; the offline gate first (`tracerl gate`)")
        summary = gate_version(settings, lc.tenant, lc.task, bad, who="demo")
        tried.append({"take_back": kappa, "version": bad, "outcome": summary["outcome"],
                      "bounds": primary_bounds(summary), "nearly_passes": nearly_passes(summary)})
        log(f"[bad] gate: {gate_line(tried[-1])}: {'; '.join(summary.get('reasons') or [])[:400]}")
        if tried[-1]["nearly_passes"]:
            break
    champion = registry.adapter_for_alias(cfg, lc.tenant, lc.task, registry.CHAMPION)
    mv = promote.canary_version(cfg, lc.tenant, lc.task)
    if mv is not None and registry.version_for_adapter(cfg, lc.tenant, lc.task, bad).version == mv.version:
        how = "passed the offline gate and the off-policy estimate"
    else:
        why = f"demo: the operator overrides the gate ({summary['outcome']}) to show the canary catching it"
        out = canary(cfg, "start", lc.tenant, lc.task, version=bad, share=dc.share, who="demo-operator", why=why)
        how = (f"gate said {summary['outcome']}{' but could not call it worse' if tried[-1]['nearly_passes'] else ''}; "
               f"started by the operator (/admin/canary): {out.get('registry', '')}")
    log(f"[bad] canary: v{bad} vs v{champion} at {dc.share:.0%} of conversations ({how})")
    report = CanaryReport("bad", bad, champion, how, gate={k: summary.get(k) for k in (
        "outcome", "reasons", "eval_candidate", "eval_champion", "canary", "offpolicy", "suites")}, tried=tried)
    return run_canary(cfg, resource, lc, dc, report, instance, log, first_round=100)


def format_canary_report(reports: list[CanaryReport], swaps: dict[str, Any]) -> str:
    lines = ["", "== canary demo ==",
             f"{'canary':<6} {'challenger':>10} {'champion':>8} {'rounds':>6} {'sessions':>8} {'failed':>6}  outcome"]
    for r in reports:
        sessions = sum(x.sessions for x in r.rounds)
        lines.append(f"{r.label:<6} {('v' + str(r.challenger)) if r.challenger else '-':>10} "
                     f"{('v' + str(r.champion)) if r.champion else '-':>8} {len(r.rounds):>6} {sessions:>8} "
                     f"{r.failed:>6}  {r.action}")
        lines += [f"       gated: {gate_line(t)}" for t in r.tried]
        lines.append(f"       entered: {r.how}")
        if r.rounds:
            lines.append(f"       decided: {r.rounds[-1].summary}")
    lines.append(f"gateway: {swaps['failed_requests_during_swaps']} failed of {swaps['requests_during_swaps']} "
                 f"requests that ended during its {len(swaps['actions'])} swaps and canary starts/stops")
    return "\n".join(lines)


def gateway_counts(cfg: TracerlConfig, tenant: str, task: str, since: str) -> dict[str, Any]:
    """The gateway's own count, from its swap log: the target's swaps and canary starts/stops since
    ``since`` (ISO time), and the live requests that ended during them and failed."""
    from pipelines.deploy.service import swap_history

    rows = [s for s in swap_history(cfg) if s.get("tenant") == tenant and s.get("task") == task and s["at"] >= since]
    return {"actions": [f"{s['action']} {s.get('from') or ''}->{s.get('to') or ''}".replace(" ->", "") for s in rows],
            "requests_during_swaps": sum(s.get("requests") or 0 for s in rows),
            "failed_requests_during_swaps": sum(s.get("failed_requests") or 0 for s in rows)}


def run_canary_demo(cfg: TracerlConfig, lc: LoopConfig, dc: CanaryDemoConfig = CanaryDemoConfig(), *,
                    resource: TracerlResource | None = None, fresh: bool = False, stop_after: bool = True,
                    instance: dg.DagsterInstance | None = None, log: Callable[[str], None] | None = None,
                    ) -> list[CanaryReport]:
    """The good candidate's canary, then the bad one's; the reports (also logged to MLflow)."""
    from pipelines import tracking
    from pipelines.deploy.service import tenant_key
    from pipelines.loop.bootstrap import ensure_serving

    log = log or (lambda s: print(s, flush=True))
    t0, since = time.monotonic(), datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    base = demo_resource(resource or TracerlResource(home=str(cfg.home)), cfg, lc)
    resource = TracerlResource(**{**base.model_dump(), "targets_json": json.dumps(
        {f"{lc.tenant}/{lc.task}": dc.target_entry()})})
    settings = resource.load()
    instance = instance or dagster_instance()
    if fresh:
        fresh_start(cfg)
    tenant_key(cfg, lc.tenant)
    started = []
    try:
        for name in stack.SERVE:
            running = stack.status(cfg, name).startswith("running")
            log(f"[setup] {name}: {stack.start(cfg, name)}")
            if not running:
                started.append(name)
        v = ensure_serving(settings, lc.tenant, lc.task)
        log(f"[setup] {lc.tenant}/{lc.task}: champion v{v}; canary on for this target: {dc.target_entry()['canary']}")
        good = good_canary(settings, resource, lc, dc, instance, log)
        reports = [good]
        if good.challenger is not None:
            reports.append(bad_canary(settings, resource, lc, dc, good.challenger, instance, log))
        text = format_canary_report(reports, gateway_counts(cfg, lc.tenant, lc.task, since))
        log(text)
        with tracking.run(settings, f"canary demo {lc.tenant}/{lc.task}", tags={"tracerl.stage": "demo"},
                          params={"loop": asdict(lc), "canary_demo": asdict(dc)}) as run:
            import mlflow

            mlflow.log_text(text, "canary_demo.txt")
            mlflow.log_dict({"reports": [asdict(r) for r in reports]}, "canary_demo.json")
        log(f"total {time.monotonic() - t0:.0f}s; MLflow run {run.info.run_id}; the canaries' own runs and the "
            f"model versions' tags (tracerl.canary.*) in the registry, model {lc.tenant}.{lc.task}")
        return reports
    finally:
        if stop_after:
            for name in reversed(started):
                stack.stop(cfg, name)


def main(cfg: TracerlConfig, iterations: int = 3, fresh: bool = False, keep: bool = False,
         take_back: tuple[float, ...] | None = None) -> int:
    dc = CanaryDemoConfig() if take_back is None else CanaryDemoConfig(take_back=take_back)
    reports = run_canary_demo(cfg, LoopConfig(iterations=iterations), dc,
                              fresh=fresh, stop_after=not keep)
    return 0 if all(r.failed == 0 for r in reports) else 1
