"""The Dagster concurrency pools: which steps share a limit across every run, and how many.

What is scarce on a host is the learner's and the gate's CPU (or GPU), not runs: the instance's
run queue admits many runs (dagster_home/dagster.yaml), and these pools hold back only the steps
that need holding, wherever they run (a loop run, `learner_job`, `ingest_job`, `reward_job`, a
backfill, an in-process run):

| pool | steps | limit | why |
|---|---|---|---|
| `learner` | `candidate_adapter` | 2 | a core (a GPU) each: two targets train at once |
| `gate` | `promotion` | 1 | one gate's evals in vLLM at a time, beside the learners |
| `ingest` | `lake_events` | 1 | one lander at a time: a second loop run's ingest finds nothing new |
| `rewards` | `turn_rewards` | 1 | likewise: one settling pass at a time, every target's turns in each |

So ingest and reward runs never wait behind a learner (a run whose learner waits for a slot holds
no other run back), and the closed loop's ingest and reward steps for several targets at once do
the work once: they run one after another, and the second lands and settles only what is new
since the first (usually nothing, in seconds).

dagster.yaml sets `concurrency.pools.default_limit: 1`, the limit of every pool not set on the
instance; Dagster 1.13 takes no per-pool limit there, so the learner's is set on the instance by
`ensure_pool_limits` (`python -m assets.pools`: `tracerl up`, `make dagster`, the in-process
driver). A limit an operator set (`dagster instance concurrency set learner 4`, the UI's
Concurrency page) is kept.
"""

from __future__ import annotations

import dagster as dg

LEARNER_POOL = "learner"  # candidate_adapter (assets/train.py)
GATE_POOL = "gate"        # promotion (assets/gate.py)
INGEST_POOL = "ingest"    # lake_events (assets/ingest.py)
REWARDS_POOL = "rewards"  # turn_rewards (assets/reward.py)
POOLS = (LEARNER_POOL, GATE_POOL, INGEST_POOL, REWARDS_POOL)

# The limits that differ from dagster.yaml's default_limit (1), set on the instance.
LIMITS = {LEARNER_POOL: 2}

# Runs that train (the loop's, learner_job's) carry this tag; the run queue caps how many are in
# progress (dagster.yaml), so they never take every run slot from ingest, rewards and the rest.
LANE_TAG = "tracerl/lane"
LEARNER_LANE = "learner"


def ensure_pool_limits(instance: dg.DagsterInstance) -> dict[str, int | None]:
    """Set each pool of LIMITS on the instance unless an operator set it; returns every pool's limit
    now (None: unlimited, an instance without `concurrency.pools.default_limit`)."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return {}
    for pool, limit in LIMITS.items():
        info = storage.get_concurrency_info(pool)
        if info.using_default_limit:  # never set, or only from default_limit (which Dagster would reset
            storage.set_concurrency_slots(pool, limit)  # to the default, even where it equals ours)
    return {pool: info.limit for pool, info in storage.get_concurrency_infos(list(POOLS)).items()}


if __name__ == "__main__":  # `python -m assets.pools`: set them on the instance under $DAGSTER_HOME
    with dg.DagsterInstance.get() as _instance:
        print("pools: " + ", ".join(f"{p} {n if n is not None else 'unlimited'}"
                                    for p, n in ensure_pool_limits(_instance).items()))
