"""The proofs of learning's harness: the product's loop on the tiny model, as `bench/learn.py` runs it
on SmolLM2.

A tracerl.toml in a temp folder (the session broker, a fresh topic, the tiny model, the simulated
users' reward spec, the target's own `[targets."acme/<task>"]` settings), a Dagster instance in a
temp DAGSTER_HOME, then Kafka + vLLM (CPU, LoRA) + the gateway. An iteration is the demo's: simulated
users -> gateway -> vLLM, then one in-process run of `closed_loop_job` (ingest -> rewards -> learner
-> gate -> deployment). The held-out rate is `pipelines/loop/heldout.py`'s, served by vLLM.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[2]
ENV = ("TRACERL_CONFIG", "DAGSTER_HOME", "MLFLOW_TRACKING_URI")


@dataclass
class Measure:
    """The held-out rate of one adapter over several eval seeds: mean and seed-to-seed sd."""

    rates: list[float]

    @property
    def mean(self) -> float:
        return statistics.mean(self.rates)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.rates)

    def __str__(self) -> str:
        return f"{self.mean:.3f} (sd {self.sd:.3f} over {len(self.rates)} eval seeds)"


@dataclass
class ServedLoop:
    """The running stack of one proof: its settings, the job's resource and instance, vLLM's url."""

    cfg: Any
    resource: Any
    instance: Any
    vllm: str
    log: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.log.append(line)
        print(line, flush=True)

    def rate(self, tenant: str, task: str, version: int, family: Any, *, seeds: int, samples: int,
             max_tokens: int) -> Measure:
        """`adapter_rate` of adapter `version` on the family's held-out prompts, once per eval seed."""
        from pipelines.adapters.store import AdapterStore
        from pipelines.loop.heldout import adapter_rate

        path = AdapterStore(self.cfg.adapter_root).get(tenant, task, version).path
        return Measure([adapter_rate(self.vllm, path, family, f"proof.{task}.v{version}", samples=samples,
                                     max_tokens=max_tokens, seed=seed).rate for seed in range(seeds)])

    def iterate(self, lc: Any, i: int) -> Any:
        """One iteration as `make demo` runs it: traffic through the gateway, then one job run."""
        from assets.demo import demo_iteration

        t0 = time.monotonic()
        rep = demo_iteration(self.cfg, self.resource, lc, i, self.instance, log=self.say)
        self.say(f"[{lc.task}] iteration {i}: live {rep.live_reward:.3f}, gate {rep.outcome} "
                 f"(candidate v{rep.candidate}, champion v{rep.champion_after}), {time.monotonic() - t0:.0f}s")
        return rep

    def iterations(self, lc: Any) -> list[Any]:
        """`lc.iterations` iterations, each checked as a user of the loop expects: all its traffic
        served, a candidate trained, and the gate's decision made, said why, and on the Dagster run."""
        reports = [self.iterate(lc, i) for i in range(1, lc.iterations + 1)]
        for r in reports:
            assert r.requests == lc.traffic.requests and r.failed_requests == 0
            assert r.candidate is not None, r.reasons
            assert r.outcome in ("promote", "reject") and r.reasons
            assert self.instance.get_run_by_id(r.run_id).tags["tracerl/outcome"] == r.outcome
        return reports


def stack_settings(target: str) -> str:
    """The proof's tables of tracerl.toml: the tiny model, the simulated users' reward spec; `target`
    adds its own `[targets."acme/<task>"]` settings."""
    from pipelines.loop.demo import SIM_REWARD_SPEC
    from pipelines.sim.evals import write_suites  # the simulated tenant's suites, in a folder of their own

    return f"""
[train]
base_model = "tiny"
[gateway]
port = 0
[serve]
start_timeout_s = 420  # vLLM on 2 busy cores can take more than the default 180 s to come up
[gate]
suites_dir = "{write_suites(tempfile.mkdtemp(prefix='tracerl-sim-evals-'))}"
[reward]
spec = "{SIM_REWARD_SPEC}"
{target}"""


@contextmanager
def served_loop(tmp: Path, bootstrap: str, target: str, models: Path | None = None) -> Iterator[ServedLoop]:
    """The stack up on the proof's settings for the block; stopped, and the environment restored, after.

    `models`: a folder the home's `models/` links to, so the proofs build the tiny model once."""
    from assets.demo import demo_resource
    from assets.resources import TracerlResource
    from pipelines import stack
    from pipelines.config import load_config
    from pipelines.deploy.service import tenant_key
    from pipelines.deploy.vllm_server import read_state
    from pipelines.loop.demo import LoopConfig
    from pipelines.services.kafka import ensure_topic

    import dagster as dg

    from tests.conftest import write_stack_toml

    toml = write_stack_toml(tmp, bootstrap, "learn", stack_settings(target))
    if models is not None:
        (tmp / "home").mkdir()
        (tmp / "home" / "models").symlink_to(models, target_is_directory=True)
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ["TRACERL_CONFIG"] = str(toml)  # the gateway process reads the same file
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # an earlier test's store must not leak in
    (tmp / "dagster_home").mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", tmp / "dagster_home")
    os.environ["DAGSTER_HOME"] = str(tmp / "dagster_home")
    cfg = load_config(toml)
    try:
        ensure_topic(cfg)
        resource = demo_resource(TracerlResource(config_path=str(toml)), cfg, LoopConfig())
        tenant_key(cfg, "acme")  # the simulated app's API key, before the gateway reads the key files
        loop = ServedLoop(cfg, resource, dg.DagsterInstance.get(), "")
        for name in stack.SERVE:
            t0 = time.monotonic()
            loop.say(f"[setup] {name}: {stack.start(cfg, name)} ({time.monotonic() - t0:.0f}s)")
        loop.vllm = read_state(cfg.home).base_url
        yield loop
    finally:
        for name in reversed(stack.SERVE):
            stack.stop(cfg, name)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
