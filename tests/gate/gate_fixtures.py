"""Helpers: a tenant/task with suites, dummy adapters registered as candidates, a fake backend."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Callable

from pipelines.adapters import registry
from pipelines import tracking
from pipelines.config import TracerlConfig
from pipelines.config.gate import GateConfig
from pipelines.adapters.store import AdapterStore

N = 30


def question(i: int) -> str:
    return f"Private question number {i}: what is the code?"


def write_suites(root: Path, tenant: str, task: str) -> None:
    folder = root / tenant / task
    folder.mkdir(parents=True)
    (folder / "answers.toml").write_text('role = "primary"\n[scorer]\nkind = "regex"\n')
    (folder / "answers.jsonl").write_text("".join(json.dumps(
        {"messages": [{"role": "user", "content": question(i)}], "reference": f"secret-{i}",
         "pattern": rf"\bsecret-{i}\b"}) + "\n" for i in range(N)))
    (folder / "style.toml").write_text(
        'role = "guardrail"\ntolerance = 0.05\n[scorer]\nkind = "regex"\npattern = \'\\.$\'\n')
    (folder / "style.jsonl").write_text("".join(json.dumps(
        {"messages": [{"role": "user", "content": f"Style prompt {i}"}]}) + "\n" for i in range(20)))


def setup(tmp: Path, url: str, **gate_kw) -> tuple[TracerlConfig, GateConfig, str, str]:
    cfg = TracerlConfig(home=tmp / "home")
    cfg.mlflow.tracking_uri = url
    tenant, task = f"t{uuid.uuid4().hex[:8]}", "qa"
    write_suites(tmp / "evals", tenant, task)
    greedy = {"temperature": 0.0, "samples_per_item": 1}  # deterministic replies unless a test asks otherwise
    return cfg, GateConfig(suites_dir=str(tmp / "evals"), **{**greedy, **gate_kw}), tenant, task


def candidate(cfg: TracerlConfig, tenant: str, task: str, parent: int | None = None,
              kl: float | None = None) -> tuple[str, int]:
    """Publish a dummy adapter version and register it as the learner does: (registry version, adapter version)."""
    import mlflow

    src = cfg.home / f"src-{uuid.uuid4().hex[:6]}"
    src.mkdir(parents=True)
    (src / "adapter_config.json").write_text("{}")
    (src / "adapter_model.safetensors").write_bytes(uuid.uuid4().bytes)  # each version its own weights
    av = AdapterStore(cfg.adapter_root).publish(tenant, task, src, {
        "parent_version": parent, "base_model_hash": "x", "data_window": {}, "reward_spec_version": [],
        "config": {}, "metrics": {} if kl is None else {"kl": kl}})
    with tracking.run(cfg, "learner", tags={"tracerl.stage": "learner"}, params={}) as run:
        mlflow.log_artifacts(str(av.path), "adapter")
    rv = registry.register_candidate(cfg, tenant, task, run.info.run_id, av.version,
                                     {"tenant": tenant, "task": task, "parent_version": parent or "base"})
    return rv, av.version


class FakeBackend:
    """Policies by served name: ``quality`` q answers item i right iff i % 3 < q; ``period``
    ends replies with '.' (the guardrail). Records every request for the pairing checks."""

    def __init__(self, policies: dict[str, tuple[int, bool]], default: tuple[int, bool] = (1, True)):
        self.policies, self.default, self.calls, self.prepared = policies, default, [], []

    def prepare(self, name, adapter_path):
        self.prepared.append((name, adapter_path))

    def release(self, name):
        pass

    def generate(self, name, messages, sampling, seed):
        self.calls.append((name, messages[0]["content"], sampling, seed))
        q, period = self.policies.get(name, self.default)
        text = messages[0]["content"]
        i = int(text.split("number ")[1].split(":")[0]) if "number" in text else 0
        answer = f"It is secret-{i}" if i % 3 < q else "I do not know"
        return answer + ("." if period else "")


def policy_for(versions: dict[int, tuple[int, bool]], tenant: str, task: str) -> dict[str, tuple[int, bool]]:
    from pipelines.gate.run import gate_name

    return {gate_name(tenant, task, v): p for v, p in versions.items()}


Check = Callable[[], None]
