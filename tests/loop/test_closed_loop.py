"""The closed loop end to end on the tiny model: real Kafka, vLLM, gateway, MLflow store.

Simulated users talk to the gateway, which records their turns to Kafka; ingest, rewards,
the learner, the gate (private evals in vLLM) and the hot swap run as in `make demo`.
"""

from __future__ import annotations

import uuid

import pytest

from pipelines.config import load_config
from pipelines.loop.demo import run_loop
from pipelines.loop.run import STAGES, LoopConfig
from pipelines.services import stack
from pipelines.sim.traffic import TrafficConfig


@pytest.fixture
def loop_cfg(tmp_path, broker, monkeypatch):
    toml = tmp_path / "tracerl.toml"
    toml.write_text(f"""
home = "{tmp_path / 'home'}"
[kafka]
bootstrap_servers = "{broker.bootstrap}"
topic = "loop-{uuid.uuid4().hex[:8]}"
group_id = "loop-{uuid.uuid4().hex[:8]}"
[ingest]
idle_seconds = 1.0
[train]
base_model = "tiny"
[gateway]
port = 0
""")
    monkeypatch.setenv("TRACERL_CONFIG", str(toml))  # the gateway process reads the same file
    # mlflow.set_tracking_uri() exports MLFLOW_TRACKING_URI, which the config honours: earlier
    # tests in this process leave theirs behind
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from pipelines.services.kafka import ensure_topic

    cfg = load_config(toml)
    ensure_topic(cfg)
    return cfg


def test_two_turns_of_the_loop(loop_cfg):
    cfg = loop_cfg
    lc = LoopConfig(iterations=2, traffic=TrafficConfig(requests=48, users=8, max_tokens=12),
                    preference_max_tokens=8, swap_probe_users=2)
    out = run_loop(cfg, lc, stop_after=True)
    r1, r2 = out["reports"]

    # every stage ran and was timed; all traffic was served
    assert set(STAGES) - {"swap"} <= set(r1.stage_s)
    assert r1.requests == r2.requests == 48 and r1.failed_requests == r2.failed_requests == 0
    assert r1.champion_before == 1 and r1.candidate == 2  # v1 is the bootstrap champion
    assert r1.outcome in ("promote", "reject") and r1.reasons
    assert r1.eval_candidate is not None and r1.eval_champion is not None

    # the next iteration is served by whatever the gate left as champion
    assert r2.champion_before == r1.champion_after
    for r in (r1, r2):
        if r.outcome == "promote":
            assert r.champion_after == r.candidate
            assert r.swap_requests > 0 and r.swap_failed == 0
            assert r.freshness_s is not None and r.freshness_s > r.stage_s["traffic"]
        else:
            assert r.freshness_s is None and r.champion_after == r.champion_before

    # the turns the learner trained on are the ones the gateway served, with their adapter version
    from pipelines.lake.query import connect

    served = dict(connect(cfg.lake).execute(
        "SELECT adapter_version, count(*) FROM turns WHERE tenant = 'acme' AND task = 'concise' GROUP BY 1").fetchall())
    assert served.get("v1", 0) >= 48

    # the report and its plots are on an MLflow run
    from pipelines.tracking import client

    c = client(cfg)
    exp = c.get_experiment_by_name(cfg.mlflow.experiment)
    [run] = c.search_runs([exp.experiment_id], "tags.`tracerl.stage` = 'loop'")
    names = {a.path for a in c.list_artifacts(run.info.run_id, "plots")}
    assert names == {"plots/live_reward.png", "plots/eval_score.png"}
    assert [m.step for m in c.get_metric_history(run.info.run_id, "live_reward")] == [1, 2, 3]

    # stop_after: what the loop started is stopped
    assert stack.status(cfg, "vllm") == "stopped" and stack.status(cfg, "gateway") == "stopped"
