"""Run one iteration of `closed_loop_job` for one target in this process, and read it back.

`tracerl loop`, `make demo` and the benchmarks run the loop through here: the same job the sensor
and the schedule start, executed in-process against the persistent instance under DAGSTER_HOME
(the repo's `dagster_home/` when unset), so each iteration is one run in the Dagster UI with every
asset's materialization and metadata. What the caller learns (stage seconds, the candidate, the
gate's outcome and eval scores, the swap) is read from that run's events, not from a side channel.

Refused (`LoopBusy`) while the target has a run queued or going, or while another process runs an
iteration for it (a lock file in the tracerl run folder): in-process runs skip the instance's
run queue, so they check both themselves. They do not skip the concurrency pools
(assets/pools.py): a step of theirs waits for its pool's slot like the daemon's runs' steps, and
`dagster_instance` sets the pools' limits on the instance first.
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import dagster as dg

from assets.gate import primary_eval
from assets.loop import LOOP_JOB, active_run
from assets.pools import ensure_pool_limits
from assets.resources import TracerlResource
from assets.targets import OUTCOME_TAG, REASON_TAG, ensure_target
from pipelines.config import TracerlConfig

STEP_EVENTS = {dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS,
               dg.DagsterEventType.STEP_FAILURE}
FAILED = "failed"  # outcome of a run that did not complete
FIELDS = {"candidate_adapter": "candidate", "promotion": "promotion", "deployment": "deployment",
          "canary": "canary"}  # LoopRun's


class LoopBusy(RuntimeError):
    """The target already has an iteration going; nothing was started."""


def dagster_instance() -> dg.DagsterInstance:
    """The persistent instance under $DAGSTER_HOME, set to the repo's `dagster_home/` when unset, with
    the pools' limits set (`ensure_pool_limits`)."""
    from pipelines.services.dagster import dagster_home

    home = Path(os.environ.setdefault("DAGSTER_HOME", str(dagster_home())))
    home.mkdir(parents=True, exist_ok=True)
    instance = dg.DagsterInstance.get()
    ensure_pool_limits(instance)
    return instance


@contextmanager
def target_lock(cfg: TracerlConfig, key: str) -> Iterator[None]:
    """Held for the whole in-process iteration; a second process asking for it is refused at once."""
    path = cfg.run_dir / f"loop-{key.replace('/', '.')}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LoopBusy(f"{key}: another process is running an iteration for it (lock {path})") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class StepWatcher:
    """Enters a context manager when a step of the run starts and exits it when the step ends.

    The demo's swap-probe users run exactly while `deployment` swaps, without the job knowing. It
    polls the run's event log from a thread (the run executes in the caller's thread)."""

    def __init__(self, instance: dg.DagsterInstance, run_id: str,
                 during: dict[str, AbstractContextManager[Any]], poll_s: float = 0.1):
        self.instance, self.run_id, self.during, self.poll_s = instance, run_id, dict(during), poll_s
        self._open: dict[str, AbstractContextManager[Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        cursor = None
        while True:
            stopping = self._stop.is_set()  # read the log once more after the run ended
            try:
                conn = self.instance.get_records_for_run(self.run_id, cursor=cursor, of_type=STEP_EVENTS)
            except Exception:  # noqa: BLE001 - the run's event log may not exist yet
                conn = None
            for rec in conn.records if conn else []:
                event = rec.event_log_entry.dagster_event
                step = event.step_key if event else None
                if step in self.during and event.event_type == dg.DagsterEventType.STEP_START:
                    self._open[step] = self.during.pop(step)
                    self._open[step].__enter__()
                elif step in self._open and event.event_type != dg.DagsterEventType.STEP_START:
                    self._open.pop(step).__exit__(None, None, None)
            cursor = conn.cursor if conn else cursor
            if stopping:
                return
            self._stop.wait(self.poll_s)

    def __enter__(self) -> "StepWatcher":
        if self.during:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.during or self._open or self._thread.is_alive():
            self._stop.set()
            self._thread.join(300)
        for cm in self._open.values():
            cm.__exit__(None, None, None)


@dataclass
class LoopRun:
    """One iteration as the Dagster run recorded it."""

    run_id: str
    target: str
    success: bool
    outcome: str                                  # the run's tracerl/outcome tag; "failed" if the run failed
    stage_s: dict[str, float] = field(default_factory=dict)   # step key -> seconds
    step_end: dict[str, float] = field(default_factory=dict)  # step key -> unix time it ended
    candidate: dict[str, Any] | None = None       # candidate_adapter metadata (None: no candidate)
    promotion: dict[str, Any] | None = None       # promotion metadata (None: nothing gated)
    deployment: dict[str, Any] | None = None      # deployment metadata (None: skipped or failed)
    canary: dict[str, Any] | None = None          # canary metadata (a run of canary_job)
    error: str | None = None                      # the first failed step's message
    skip_reason: str | None = None                # why the learner trained nothing (tracerl/reason)

    @property
    def reasons(self) -> list[str]:
        return list((self.promotion or {}).get("reasons") or [])


def read_run(instance: dg.DagsterInstance, run_id: str) -> LoopRun:
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise LookupError(f"no Dagster run {run_id} in {instance.root_directory}")
    started: dict[str, float] = {}
    out = LoopRun(run_id=run_id, target=run.tags.get("dagster/partition", ""),
                  success=run.status == dg.DagsterRunStatus.SUCCESS, outcome="")
    for rec in instance.get_records_for_run(run_id).records:
        entry = rec.event_log_entry
        event = entry.dagster_event
        if event is None:
            continue
        if event.event_type == dg.DagsterEventType.STEP_START:
            started[event.step_key] = entry.timestamp
        elif event.event_type in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE):
            out.step_end[event.step_key] = entry.timestamp
            out.stage_s[event.step_key] = round(entry.timestamp - started.get(event.step_key, entry.timestamp), 1)
            if event.event_type == dg.DagsterEventType.STEP_FAILURE and out.error is None:
                out.error = f"{event.step_key}: {event.step_failure_data.error.message.strip()}"
        elif event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            mat = entry.asset_materialization
            field_name = FIELDS.get(mat.asset_key.to_user_string())
            if field_name:
                setattr(out, field_name, {k: v.value for k, v in mat.metadata.items()})
    out.outcome = FAILED if not out.success else run.tags.get(OUTCOME_TAG, "")
    out.skip_reason = run.tags.get(REASON_TAG)
    return out


def check_resource(resource: TracerlResource, cfg: TracerlConfig) -> None:
    """The run's assets load their settings from `resource`; refuse settings only this process has."""
    if resource.load() != cfg:
        raise ValueError("the loop's settings differ from what its Dagster run would load: settings changed "
                         "in memory are invisible to the run; put them in tracerl.toml (or TRACERL_HOME) "
                         f"and pass that file (resource {resource!r})")


def run_iteration(resource: TracerlResource, tenant: str, task: str, *, instance: dg.DagsterInstance | None = None,
                  run_config: dict[str, Any] | None = None, tags: dict[str, str] | None = None,
                  during: dict[str, AbstractContextManager[Any]] | None = None) -> LoopRun:
    """Execute `closed_loop_job` for tenant/task in this process and wait; `during` maps step keys
    to context managers held while that step runs. Raises `LoopBusy` without starting anything
    when the target has an iteration going; a failed run is returned (`success` False), not raised."""
    cfg = resource.load()
    instance = instance or dagster_instance()
    key = ensure_target(instance, tenant, task)
    with target_lock(cfg, key):
        busy = active_run(instance, key)
        if busy is not None:
            raise LoopBusy(f"{key}: Dagster run {busy.run_id} ({busy.job_name}, {busy.status.value}) is still "
                           f"going; wait for it, or cancel it in the Dagster UI")
        return run_job(resource, LOOP_JOB, key, instance=instance, run_config=run_config, tags=tags, during=during)


def run_job(resource: TracerlResource, job: str, partition_key: str | None = None, *,
            instance: dg.DagsterInstance | None = None, run_config: dict[str, Any] | None = None,
            tags: dict[str, str] | None = None,
            during: dict[str, AbstractContextManager[Any]] | None = None) -> LoopRun:
    """Execute one job of the definitions (e.g. `ingest_job`, `canary_job`) in this process with
    `resource`'s settings, and read the run back; a failed run is returned, not raised."""
    from assets.definitions import defs

    instance = instance or dagster_instance()
    run_id = str(uuid.uuid4())
    with StepWatcher(instance, run_id, during or {}):
        defs.resolve_job_def(job).execute_in_process(
            instance=instance, partition_key=partition_key, run_id=run_id, raise_on_error=False,
            run_config={**(run_config or {}), "resources": {"tracerl": {"config": resource_config(resource)}}},
            tags={"tracerl/driver": "in-process", **(tags or {})})
    return read_run(instance, run_id)


def resource_config(resource: TracerlResource) -> dict[str, Any]:
    """Every set field of the resource as run config for `tracerl` (every service resource of the run
    reads it, and the run records where its settings came from: the UI shows it, a re-execution reuses it)."""
    return {k: getattr(resource, k) for k in type(resource).model_fields if getattr(resource, k) is not None}



def describe(run: LoopRun, cfg: TracerlConfig) -> list[str]:
    """What `tracerl loop` prints: the run, the candidate, the gate's decision, what serves now."""
    from pipelines.adapters import registry
    from pipelines.deploy.routing import Router

    tenant, _, task = run.target.partition("/")
    state = "succeeded" if run.success else "FAILED"
    lines = [f"{run.target}: Dagster run {run.run_id} {state} (outcome: {run.outcome or 'none'})"]
    c = run.candidate
    if c:
        lines.append(f"  candidate: v{c['adapter_version']} (registry version {c['registry_version']}), trained on "
                     f"{c['turns']} new + {c.get('replayed_turns', 0)} replayed turns")
    elif run.success:
        lines.append(f"  candidate: none: {run.skip_reason or 'the learner trained nothing'}")
    p = run.promotion
    if p:
        lines.append(f"  gate:      {p['outcome']}: {'; '.join(p.get('reasons') or [])}")
        cand, champ = primary_eval(p)
        if cand is not None:
            lines.append(f"  eval:      candidate {cand:.3f}, champion "
                         f"{champ if champ is not None else float('nan'):.3f} (primary suite)")
    if run.error:
        lines.append(f"  failed:    {run.error}")
    live = Router(cfg.routes_path).live(tenant, task)  # the gateway's own record
    champion = registry.adapter_for_alias(cfg, tenant, task, registry.CHAMPION)
    lines.append(f"  serving:   {'v' + str(live.version) if live else 'nothing routed (the base model)'} "
                 f"(registry champion: {'v' + str(champion) if champion is not None else 'none'})")
    return lines
