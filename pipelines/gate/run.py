"""One gate pass for one candidate model version: evaluate, decide, record, move aliases.

    suites (files) -> contamination check (training turns of the candidate's lineage)
      -> candidate and champion (or the base model) loaded side by side in vLLM
      -> same items, same sampling, same seeds -> per-item scores (and replies, in memory)
      -> paired test per suite (primaries: sequential looks) + MDE -> behaviour signatures
      -> decision with reasons
      -> with canary.enabled, on a pass: the off-policy estimate on the held-back slice
         (live_estimate.py); significantly worse than the champion = reject, else the canary
      -> MLflow run (aggregates, hashed item ids, plot; its description: the decision, reasons and
         per-suite table, review.py) + the version's searchable tags and "Gate" section + aliases

Nothing of the evals in clear text leaves: MLflow gets means, bounds, p-values, counts, item hashes
and suite fingerprints; never their prompts, references or replies. The side-by-side table holds
recent real prompts and both models' replies to them (side_by_side.py), for a person to read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from pipelines.adapters import promote as reg
from pipelines.adapters.registry import CHAMPION, describe, model_name, run_link, version_link
from pipelines.adapters.version import label, tag_version
from pipelines.config import GateConfig, TracerlConfig, gate_config
from pipelines.evals.contamination import ContaminationError, find_contamination, hashes_of, trained_prompts
from pipelines.evals.scorers import ToolCall, judge_from
from pipelines.evals.suites import Suite, load_suites, suite_problem
from pipelines.gate.decide import HOLD, PROMOTE, REJECT, Decision, judge_suite, predicted_vs_measured
from pipelines.gate.decide import decide as decide_
from pipelines.gate.evaluate import Backend, Samples, VllmBackend, sample_suite
from pipelines.gate.live_estimate import offpolicy_verdict
from pipelines.gate.reply_cache import ReplyCache, weights_key
from pipelines.gate.offpolicy import WORSE, OffPolicyVerdict
from pipelines.gate.sequential import sequential_compare
from pipelines.gate.side_by_side import ARTIFACT as SIDE_BY_SIDE, recent_prompts, side_by_side
from pipelines.gate.signatures import compare_signatures
from pipelines.gate.stats import compare


@dataclass
class GateResult:
    tenant: str
    task: str
    registry_version: str
    baseline: str                     # champion registry version, or "base"
    decision: Decision
    run_id: str | None = None
    seconds: float = 0.0
    items: int = 0
    promoted: dict[str, Any] | None = None
    contamination: list[str] = field(default_factory=list)
    offpolicy: OffPolicyVerdict | None = None  # with canary.enabled, on a pass
    canary: bool = False              # passed and entered the canary (challenger, status canary), not champion
    side_by_side: dict[str, list[Any]] | None = None  # recent real prompts, both models' replies (side_by_side.py)
    reused: dict[str, int] = field(default_factory=dict)  # eval replies taken from reply_cache, per arm
    predicted_gain: float | None = None  # what the learner's learned reward predicted (the adapter's meta)
    measured_gain: float | None = None   # what the private evals measured: the smallest primary delta

    @property
    def passed(self) -> bool:
        return self.decision.passed


def gate_name(tenant: str, task: str, adapter_version: int) -> str:
    """Adapter name inside vLLM during the gate (never the deployer's ``tenant/task/vN``)."""
    return f"gate.{tenant}.{task}.{label(adapter_version)}"


def embedded_backend(cfg: TracerlConfig, gate: GateConfig) -> VllmBackend:
    if gate.vllm_url:
        return VllmBackend(gate.vllm_url, cfg.serve.served_model_name)
    from pipelines.deploy.vllm_server import start_vllm
    from pipelines.models.registry import resolve_base_model

    state = start_vllm(resolve_base_model(cfg.train.base_model, cfg.home), home=cfg.home, config=cfg.serve)
    return VllmBackend(state.base_url, cfg.serve.served_model_name)


def run_gate(cfg: TracerlConfig, tenant: str, task: str, registry_version: str, *,
             backend: Backend | None = None, gate: GateConfig | None = None,
             training_prompts: Iterable[list[dict[str, Any]]] | None = None,
             deploy: reg.Deploy | None = None) -> GateResult:
    """Gate ``registry_version`` of ``tenant.task`` against its champion (or the base model).

    ``training_prompts``: the input messages the candidate's lineage trained on; None reads
    them from the lake's ``trained_turns`` ledger. With ``canary.enabled`` a pass does not move
    ``champion``: the version becomes the ``challenger`` with status ``canary`` (after the
    off-policy estimate), and reconcile starts its canary in the gateway. ``deploy(tenant, task, adapter_version)``
    is called before ``champion`` moves (promote only; not in review mode).
    Raises ``ContaminationError`` (after tagging the version rejected) if eval items were trained on.
    """
    from pipelines.tracking import client
    from pipelines.adapters.store import AdapterStore

    t0, started = time.monotonic(), time.time()
    cfg = cfg.for_target(tenant, task)  # this target's [targets."tenant[/task]"] gate settings
    gate = gate or gate_config(cfg)
    c, name = client(cfg), model_name(tenant, task)
    cand = c.get_model_version(name, str(registry_version))
    cand_av = tag_version(cand)
    champ = reg.alias_version(cfg, tenant, task, CHAMPION)
    if champ is not None and str(champ.version) == str(registry_version):
        raise reg.RegistryError(f"{name} version {registry_version} is already the champion; nothing to gate")
    baseline = str(champ.version) if champ is not None else "base"
    result = GateResult(tenant, task, str(registry_version), baseline, Decision(REJECT, []))
    suites = load_suites(gate.suites_dir, tenant, task)
    store = AdapterStore(cfg.adapter_root)
    learned = store.get(tenant, task, cand_av).meta.get("reward_model") or {}  # learner.reward_model's numbers
    result.predicted_gain = learned.get("predicted_gain")

    # -- private evals are never trained on ------------------------------------------------
    hashes = hashes_of(suites)
    if training_prompts is None:
        lineage = [av.version for av in store.lineage(tenant, task, cand_av)]
        training_prompts = trained_prompts(cfg, tenant, task, lineage)
    hits = find_contamination(training_prompts, hashes)
    if hits:
        result.contamination = hits
        result.decision = Decision(REJECT, [f"contamination: {len(hits)} eval item(s) found in the training data "
                                            f"of this version's lineage (hashes {', '.join(h[:12] for h in hits[:10])})"])
        _record(cfg, gate, result, suites, {}, started)
        reg.mark_rejected(cfg, tenant, task, str(registry_version))
        raise ContaminationError(f"{name} v{registry_version}: " + result.decision.reasons[0])

    problem = suite_problem(gate.suites_dir, tenant, task, suites)  # none, or placeholder items
    scores: dict[str, tuple[list[float], list[float]]] = {}
    if problem:
        lenient = not suites and not gate.fail_on_missing_suites  # placeholders never pass
        outcome = (HOLD if gate.review else PROMOTE) if lenient else REJECT
        result.decision = Decision(outcome, [problem + ("" if suites else
                                             f" (gate.fail_on_missing_suites={gate.fail_on_missing_suites})")])
    else:
        # -- serve both side by side, evaluate on identical requests -------------------------
        backend = backend or embedded_backend(cfg, gate)
        cand_name = gate_name(tenant, task, cand_av)
        champ_av = tag_version(champ) if champ is not None else None
        champ_name = gate_name(tenant, task, champ_av) if champ_av is not None else cfg.serve.served_model_name
        backend.prepare(cand_name, store.get(tenant, task, cand_av).path)
        if champ_av is not None:
            backend.prepare(champ_name, store.get(tenant, task, champ_av).path)
        judge = judge_from(gate.judge_url, gate.judge_model, gate.judge_api_key_env)
        verdicts, replies = [], Replies()
        caches = None
        if gate.reuse_replies:
            base_hash = str(store.get(tenant, task, cand_av).meta["base_model_hash"])
            caches = tuple(ReplyCache(cfg.gate_replies_dir(tenant, task), weights_key(
                base_hash, None if av is None else store.get(tenant, task, av).path)) for av in (cand_av, champ_av))
        try:
            for s in suites:
                verdict, scores[s.name] = _evaluate(backend, cand_name, champ_name, s, gate, judge, replies, caches)
                verdicts.append(verdict)
            if gate.side_by_side:
                primary = next((s for s in suites if s.role == "primary"), None)
                prompts = recent_prompts(cfg, tenant, task, gate.side_by_side, hashes)
                if prompts:
                    result.side_by_side = side_by_side(backend, cand_name, champ_name, prompts, primary, gate, judge)
        finally:
            backend.release(cand_name)
            if champ_av is not None:
                backend.release(champ_name)
            if caches is not None:
                result.reused = {"candidate": caches[0].hits, "champion": caches[1].hits}
        kl = store.get(tenant, task, cand_av).meta.get("metrics", {}).get("kl")
        sigs = (compare_signatures(replies.candidate, replies.champion, gate.signatures, 1.0 - gate.confidence,
                                   gate.n_bootstrap, gate.seed) if gate.signatures.enabled else [])
        result.decision = decide_(verdicts, gate, None if kl is None else float(kl), sigs)
        result.items = sum(len(s.items) for s in suites)
        # the learned reward's prediction beside the evals' measure: said, never decided on
        result.measured_gain, note = predicted_vs_measured(result.predicted_gain, learned.get("predicted_gain_se"),
                                                           verdicts, gate.confidence)
        if note:
            result.decision.warnings.append(note)
            result.decision.reasons.append(f"warning: {note}")
    if result.decision.outcome == PROMOTE and cfg.canary.enabled:
        _offpolicy(cfg, result, store.get(tenant, task, cand_av).path,
                   tag_version(champ) if champ is not None else None)
    _record(cfg, gate, result, suites, scores, started)

    # -- move aliases -------------------------------------------------------------------------
    if result.decision.outcome == PROMOTE and cfg.canary.enabled:  # live evidence first (docs/canary.md)
        reg.enter_canary(cfg, tenant, task, str(registry_version), "gate", result.decision.reasons[-1])
        result.canary = True
    elif result.decision.outcome == PROMOTE:
        result.promoted = reg.promote(cfg, tenant, task, str(registry_version), deploy)
    elif result.decision.outcome == HOLD:
        reg.mark_challenger(cfg, tenant, task, str(registry_version))
    else:
        reg.mark_rejected(cfg, tenant, task, str(registry_version))
    result.seconds = round(time.monotonic() - t0, 2)
    return result


def _offpolicy(cfg: TracerlConfig, result: GateResult, candidate_dir: Any, champion: int | None) -> None:
    """The off-policy estimate on the held-back slice: a candidate estimated significantly worse
    than the champion's logged reward is rejected; ``refuse`` (too little overlap or data) lets the
    canary decide alone, with the reason recorded."""
    v = offpolicy_verdict(cfg, result.tenant, result.task, candidate_dir, champion)
    result.offpolicy = v
    if v.verdict == WORSE:
        result.decision.outcome = REJECT
        result.decision.reasons.append(f"off-policy estimate: {v.reason}; not entering the canary")
    else:
        result.decision.reasons.append(f"off-policy estimate ({v.verdict}): {v.reason}; entering the canary "
                                       f"at {cfg.canary.share:.0%} of conversations")


@dataclass
class Replies:
    """Every reply's behaviour (pipelines/contract/behaviour.py), paired by position: candidate[i]
    and champion[i] answered the same item with the same seed. Texts are classified and dropped."""

    candidate: list = field(default_factory=list)
    champion: list = field(default_factory=list)

    def add(self, suite: Suite, a: Samples, b: Samples, clarify_max_chars: int) -> None:
        from pipelines.contract.behaviour import classify

        for item, ta, tb in zip(suite.items, a.texts, b.texts):
            tools = _tools_of(suite, item)
            self.candidate += [classify(t, tools, clarify_max_chars) for t in ta]
            self.champion += [classify(t, tools, clarify_max_chars) for t in tb]


def _tools_of(suite: Suite, item: Any) -> list[dict[str, Any]] | None:
    """The tools the request offered: the item's, else a tool_call scorer's."""
    tools = item.extra.get("tools")
    if not tools and isinstance(suite.scorer, ToolCall):
        tools = suite.scorer.tools
    return tools or None


def _evaluate(backend: Backend, cand: str, champ: str, suite: Suite, gate: GateConfig, judge: Any,
              replies: Replies, caches: tuple[ReplyCache, ReplyCache] | None = None
              ) -> tuple[Any, tuple[list[float], list[float]]]:
    """(verdict, per-item mean scores of candidate and champion). Primaries take sequential looks
    (gate.looks of them; one at temperature 0); guardrails one look at the full alpha.
    ``caches``: (candidate's, champion's) kept replies."""
    import numpy as np

    def draw(first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        a = sample_suite(backend, cand, suite, gate, judge, first, count, caches and caches[0])
        b = sample_suite(backend, champ, suite, gate, judge, first, count, caches and caches[1])
        replies.add(suite, a, b, gate.signatures.clarify_max_chars)
        sums[0] = a.scores if sums[0] is None else [x + y for x, y in zip(sums[0], a.scores)]
        sums[1] = b.scores if sums[1] is None else [x + y for x, y in zip(sums[1], b.scores)]
        return np.asarray(a.scores, dtype=float), np.asarray(b.scores, dtype=float)

    sums: list[Any] = [None, None]
    if suite.role == "primary":
        looks = sequential_compare(draw, test=gate.test, confidence=gate.confidence,
                                   samples_per_item=gate.samples_per_item, looks=gate.looks, min_gain=gate.min_gain,
                                   futility_gain=gate.futility_gain, n_bootstrap=gate.n_bootstrap, seed=gate.seed)
        last = looks[-1]
        verdict = judge_suite(suite.name, suite.role, suite.tolerance, last.stats, gate, samples=last.samples,
                              looks=looks)
    else:
        draw(0, gate.samples_per_item)
        k = gate.samples_per_item
        st = compare([sum(x) / k for x in sums[0]], [sum(x) / k for x in sums[1]], gate.test, gate.confidence,
                     gate.n_bootstrap, gate.seed)
        verdict = judge_suite(suite.name, suite.role, suite.tolerance, st, gate, samples=k)
    k = verdict.samples
    return verdict, ([sum(x) / k for x in sums[0]], [sum(x) / k for x in sums[1]])


def _record(cfg: TracerlConfig, gate: GateConfig, result: GateResult, suites: list, scores: dict,
            started: float) -> None:
    """One MLflow run (started when the gate did; its description says the decision, pipelines/gate/
    review.py) + the version's few searchable tags and its "Gate" section: aggregates and item
    hashes only, but for the side-by-side table of recent real prompts."""
    import mlflow
    import numpy as np

    from pipelines import tracking
    from pipelines.gate import review
    from pipelines.gate.plots import log_history_plot

    d = result.decision
    tags = {"tenant": result.tenant, "task": result.task, "tracerl.stage": "gate",
            "registry_version": result.registry_version, "baseline": result.baseline, "decision": d.outcome}
    vs = f"v{result.baseline}" if result.baseline != "base" else "base"
    with tracking.run(cfg, f"gate {result.tenant}/{result.task} v{result.registry_version} vs {vs}", tags=tags,
                      params={"gate": gate.to_dict()}, started=started) as run:
        result.run_id = run_id = run.info.run_id
        for v in d.verdicts:
            st = v.stats
            mlflow.log_metrics({f"{v.suite}.candidate": st.candidate_mean, f"{v.suite}.champion": st.champion_mean,
                                f"{v.suite}.delta": st.delta, f"{v.suite}.low": st.low,
                                f"{v.suite}.p_gain": st.p_gain, f"{v.suite}.p_loss": st.p_loss,
                                f"{v.suite}.n": st.n, f"{v.suite}.passed": float(v.passed),
                                f"{v.suite}.mde": v.mde, f"{v.suite}.mde_observed": v.mde_observed,
                                f"{v.suite}.samples": v.samples, f"{v.suite}.looks": float(len(v.looks) or 1)})
        for sg in d.signatures:
            mlflow.log_metrics({f"signature.{sg.name}.candidate": sg.candidate,
                                f"signature.{sg.name}.champion": sg.champion,
                                f"signature.{sg.name}.blocked": float(sg.blocked)})
        if result.offpolicy is not None:
            op = result.offpolicy
            mlflow.log_metrics({k: float(x) for k, x in (
                ("offpolicy.estimate", op.estimate.value), ("offpolicy.se", op.estimate.se),
                ("offpolicy.ess", op.estimate.ess), ("offpolicy.n", op.estimate.n),
                ("offpolicy.clipped", op.estimate.clipped), ("offpolicy.champion", op.champion_value),
                ("offpolicy.low", op.low), ("offpolicy.high", op.high)) if np.isfinite(x)})
            mlflow.log_dict(op.to_dict(), "gate/offpolicy.json")
        mlflow.log_metrics({f"reused_replies.{arm}": float(n) for arm, n in result.reused.items()})
        gains = {"predicted_gain": result.predicted_gain, "measured_gain": result.measured_gain}
        mlflow.log_metrics({k: float(x) for k, x in gains.items() if x is not None})
        mlflow.log_dict(d.to_dict(), "gate/decision.json")
        sbs_link = None
        if result.side_by_side:  # a table in the run's Artifacts (a cell's full text one click away)
            mlflow.log_table(data=result.side_by_side, artifact_file=SIDE_BY_SIDE)
            sbs_link = tracking.run_path(run.info.experiment_id, run_id, SIDE_BY_SIDE)
        by_name = {s.name: s for s in suites}
        mlflow.log_dict({name: {"fingerprint": by_name[name].fingerprint,
                                "items": [{"hash": it.hash, "candidate": a, "champion": b}
                                          for it, a, b in zip(by_name[name].items, sc[0], sc[1])]}
                         for name, sc in scores.items()}, "gate/item_scores.json")
        mlflow.set_tag(review.RUN_NOTE, review.run_description(
            result, suites, version_link(result.tenant, result.task, result.registry_version,
                                         f"model version {result.registry_version}"), sbs_link))
        reg.set_tags(cfg, result.tenant, result.task, result.registry_version, review.version_tags(result, run_id))
        describe(cfg, result.tenant, result.task, result.registry_version, "Gate", review.version_section(
            result, suites, run_link(cfg, run_id, f"gate v{result.registry_version} vs {vs}"), sbs_link))
        if d.verdicts:
            log_history_plot(cfg, result.tenant, result.task)


def gate_candidates(cfg: TracerlConfig, candidates: list[dict[str, Any]], backend: Backend | None = None,
                    deploy: reg.Deploy | None = None) -> list[dict[str, Any]]:
    """Gate each ``{"tenant", "task", "registry_version"}`` (the learner asset's metadata); one
    summary per candidate. A contaminated candidate is reported, not raised, so the others
    are still gated; its summary has ``outcome = "contaminated"``."""
    out = []
    for c in candidates:
        tenant, task, version = c["tenant"], c["task"], str(c["registry_version"])
        try:
            r = run_gate(cfg, tenant, task, version, backend=backend, deploy=deploy)
        except ContaminationError as err:
            out.append({"tenant": tenant, "task": task, "registry_version": version, "outcome": "contaminated",
                        "passed": False, "reasons": [str(err)]})
            continue
        out.append({"tenant": tenant, "task": task, "registry_version": version, "baseline": r.baseline,
                    "outcome": r.decision.outcome, "passed": r.passed, "reasons": r.decision.reasons,
                    "items": r.items, "seconds": r.seconds, "mlflow_run_id": r.run_id,
                    "warnings": r.decision.warnings, "canary": r.canary,
                    "predicted_gain": r.predicted_gain, "measured_gain": r.measured_gain,
                    "offpolicy": _finite(r.offpolicy.to_dict()) if r.offpolicy is not None else None,
                    "suites": {v.suite: {"role": v.role, "candidate": v.stats.candidate_mean,
                                         "champion": v.stats.champion_mean, "delta": v.stats.delta,
                                         "low": v.stats.low, "high": v.stats.high, "passed": v.passed, "mde": v.mde,
                                         "samples_per_item": v.samples, "looks": len(v.looks)}
                               for v in r.decision.verdicts},
                    "signatures": {g.name: {"candidate": g.candidate, "champion": g.champion, "blocked": g.blocked}
                                   for g in r.decision.signatures}})
    return out


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe: NaN and infinities (an estimate that refused) as None."""
    import math

    return {k: _finite(v) if isinstance(v, dict) else (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in d.items()}


def undecided_version(cfg: TracerlConfig, tenant: str, task: str) -> str | None:
    """The newest registered version the gate has not decided on (no decision or status tag, not the
    champion: the bootstrap's version 1 is champion without a gate), or None."""
    from pipelines.tracking import client

    champ = reg.alias_version(cfg, tenant, task, CHAMPION)
    versions = client(cfg).search_model_versions(f"name = '{model_name(tenant, task)}'")
    open_ = [mv for mv in versions if not mv.tags.get(reg.DECISION) and not mv.tags.get(reg.STATUS)
             and (champ is None or str(mv.version) != str(champ.version))]
    return str(max(open_, key=lambda mv: int(mv.version)).version) if open_ else None


def gate_version(cfg: TracerlConfig, tenant: str, task: str, adapter_version: int | None = None,
                 who: str = "cli") -> dict[str, Any]:
    """Gate one candidate from outside a loop run (``tracerl gate``): the adapter version given, else
    the newest one not yet decided; on a promotion the gateway is reconciled to the new champion at
    once, as the loop's `deployment` asset would. Returns the gate's summary plus ``serving``."""
    from pipelines.adapters.registry import adapter_for_alias, version_for_adapter
    from pipelines.deploy.reconcile import reconcile

    if adapter_version is None:
        registry_version = undecided_version(cfg, tenant, task)
        if registry_version is None:
            raise LookupError(f"{model_name(tenant, task)}: no registered version waits for the gate; "
                              f"name one with --version")
    else:
        mv = version_for_adapter(cfg, tenant, task, adapter_version)
        if mv is None:
            raise LookupError(f"{model_name(tenant, task)}: adapter {label(adapter_version)} is not registered")
        registry_version = str(mv.version)
    (summary,) = gate_candidates(cfg, [{"tenant": tenant, "task": task, "registry_version": registry_version}])
    if summary["outcome"] == PROMOTE:
        summary["reconcile"] = reconcile(cfg, [(tenant, task)], who=f"gate ({who})").to_dict()
    summary["serving"] = adapter_for_alias(cfg, tenant, task, CHAMPION)
    return summary
