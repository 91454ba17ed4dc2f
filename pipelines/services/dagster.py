"""Dagster's webserver and daemon (`dagster dev`) on the tracerl code location.

`dagster dev` runs both: the webserver (UI, asset graph, runs) and the daemon that
ticks the schedules and sensors, so the loop turns by itself. It is started in its own
process group and stopped by signalling that group, which is what `set -m` gives a
shell (without it, SIGTERM does not reach the children). `DAGSTER_HOME` is the repo's
`dagster_home/` unless the environment names another. Dagster reads tracerl's settings, the
reward spec included, from the same configuration as the CLI that started it. Before it starts,
`python -m assets.pools` sets the concurrency pools' limits that dagster.yaml cannot hold (the
learner's) on that instance, keeping any an operator set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipelines.config import TracerlConfig
from pipelines.services import process

NAME = "dagster"
DEFAULT_PORT = 3000
REPO = Path(__file__).resolve().parents[2]


def dagster_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or REPO / "dagster_home").resolve()


def start_dagster(cfg: TracerlConfig, port: int | None = None, timeout: float = 180.0,
                  reward_spec: Path | None = None) -> process.ProcessState:
    """Start `dagster dev` (or return the running one). ``reward_spec``: the fallback reward spec
    for a configuration that names none (the caller's ``reward.spec.fallback_spec_path()``, an
    absolute path: it depends on the caller's env and working directory, and Dagster runs in the
    repo); None hands none over."""
    state = process.read_state(cfg.run_dir, NAME)
    if state:
        return state
    port = port or process.free_port(DEFAULT_PORT)
    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DAGSTER_HOME": str(home), "TRACERL_HOME": str(cfg.home.resolve())}
    # The reward spec comes from the same configuration ($TRACERL_CONFIG, which Dagster reads at
    # every run); only the fallback for a config naming none comes from the caller.
    env.pop("TRACERL_REWARD_SPEC", None)
    if reward_spec is not None:
        env["TRACERL_REWARD_SPEC"] = str(reward_spec)
    # the pools' limits, on the instance (assets/pools.py): a subprocess, pipelines never imports Dagster
    subprocess.run([sys.executable, "-m", "assets.pools"], env=env, cwd=REPO, check=True, timeout=120,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    dagster = Path(sys.executable).parent / "dagster"
    state = process.spawn(
        NAME, [str(dagster), "dev", "-m", "assets.definitions", "-h", "127.0.0.1", "-p", str(port)],
        run_dir=cfg.run_dir, log=cfg.log_dir / "dagster.log", port=port, url=f"http://127.0.0.1:{port}",
        env=env, cwd=REPO)
    process.wait_http(state, "/server_info", timeout, cfg.run_dir)
    return state


def stop_dagster(cfg: TracerlConfig) -> bool:
    return process.stop(cfg.run_dir, NAME, timeout=30.0)


def read_state(cfg: TracerlConfig) -> process.ProcessState | None:
    return process.read_state(cfg.run_dir, NAME)
