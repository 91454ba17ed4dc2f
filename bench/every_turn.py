"""Does the reward model teach from the turns nobody labelled? Labelled-only against every turn, realistic users.

The tiny Llama, the `style` family (users like a reply that opens with a greeting: 4-5% of the
base model's replies), users of the realistic profile (`UserModel.realistic`: 5% of turns voted,
implicit signals partial and noisy, no follow-up sentiment, no task_success). Each condition runs
ITERATIONS on-policy iterations from the base model: SESSIONS sessions sampled from the newest
adapter by the offline driver (pipelines/sim/offline.py: the gateway's events without the gateway),
landed (pipelines/ingest/direct.py), rewarded by the reward engine, then one `run_learner`
(branch and replay on, the tiny model's optimizer settings of tests/train/test_served_learns_sparse.py):

- labelled-only: the reward spec without hindsight, `learner.reward_model` off;
- every turn: hindsight on, `learner.reward_model` on (shipped reward-model settings).

After the last iteration the head adapter's liked share on the held-out prompts (4 eval seeds x
48 prompts x 8 samples). Repeated for each train/traffic seed: the seed-to-seed spread is the noise.

    .venv/bin/python bench/every_turn.py
    TRACERL_EVERY_TURN_SEEDS=0,1 TRACERL_EVERY_TURN_ITERATIONS=2 .venv/bin/python bench/every_turn.py
    TRACERL_EVERY_TURN_CONDITIONS="every turn" .venv/bin/python bench/every_turn.py  # one condition

Last line: every_turn_gain=<mean(every turn) - mean(labelled-only) over seeds>.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEEDS = [int(s) for s in os.environ.get("TRACERL_EVERY_TURN_SEEDS", "0,1,2,3").split(",")]
ITERATIONS = int(os.environ.get("TRACERL_EVERY_TURN_ITERATIONS", "3"))
SESSIONS = int(os.environ.get("TRACERL_EVERY_TURN_SESSIONS", "1000"))
CONDITIONS = tuple(os.environ.get("TRACERL_EVERY_TURN_CONDITIONS", "labelled-only,every turn").split(","))


def held_out_rate(base: Path, adapter: Path | None, fam, seeds: int = 4) -> list[float]:
    from pipelines.sim.families import Reply, model_input
    from pipelines.sim.policy import HFPolicy

    pol, held, out = HFPolicy(base, adapter), fam.prompts("heldout"), []
    for s in range(seeds):
        groups = pol.sample([model_input(fam, m) for m in held], 8, 24, seed=1000 + s)
        liked = [fam.liked(Reply(x.text, x.tokens, x.finish_reason)) for g in groups for x in g]
        out.append(sum(liked) / len(liked))
    return out


def learner_config(condition: str, seed: int, base: Path, home: Path):
    """(config, reward spec book) of one condition: the tiny model's optimizer settings, no eval
    suites; labelled-only also turns hindsight off in the reward spec (None: the shipped spec)."""
    from pipelines.config import TracerlConfig
    from pipelines.config.train import OptimizerSettings, TrainConfig
    from pipelines.reward.spec import SpecBook

    every = condition == "every turn"
    cfg = TracerlConfig(home=home)
    cfg.gate.suites_dir = str(cfg.home / "evals")  # no suites: nothing excluded from training
    cfg.train = TrainConfig(base_model=str(base), seed=seed,
                            optimizer=OptimizerSettings(lr=5e-3, steps_per_iteration=8, micro_batch_size=32))
    cfg.learner.min_new_turns, cfg.learner.max_turns, cfg.learner.branch_max_kl = 4, 4096, 3.0
    cfg.learner.reward_model = every
    return cfg, (None if every else SpecBook({"default": {"weights": {"hindsight": 0.0}}}))


def run(condition: str, seed: int, base: Path, root: Path) -> float:
    from pipelines.adapters.store import AdapterStore
    from pipelines.ingest.direct import land
    from pipelines.reward.engine import run_rewards
    from pipelines.sim.families import family
    from pipelines.sim.offline import OfflineTraffic, play_sessions
    from pipelines.sim.policy import HFPolicy
    from pipelines.sim.sessions import UserModel
    from pipelines.train.run import run_learner

    cfg, book = learner_config(condition, seed, base,
                               root / f"{'every' if condition == 'every turn' else 'labelled'}-{seed}")
    fam, store = family("style"), AdapterStore(cfg.adapter_root)
    for i in range(ITERATIONS):
        t0 = time.monotonic()
        head = (store.list("acme", "style") or [None])[-1]
        start = datetime(2026, 11, 1, tzinfo=timezone.utc) + timedelta(days=3 * i)
        events, liked = play_sessions(HFPolicy(base, head.path if head else None), fam, UserModel.realistic(0.05),
                                      OfflineTraffic(sessions=SESSIONS, seed=100 * seed + i,
                                                     adapter_version=head.version if head else None), start)
        land(cfg.lake, events)
        run_rewards(cfg.lake, book=book, now=start + timedelta(days=2))
        t1 = time.monotonic()
        r = run_learner(cfg, "acme", "style")
        m = r.metrics
        print(f"[{condition}] seed {seed} iteration {i + 1}: traffic liked {sum(liked) / len(liked):.3f} of "
              f"{len(liked)} turns ({t1 - t0:.0f} s); learner {r.status} in {time.monotonic() - t1:.0f} s, "
              f"turns {({k[6:]: v for k, v in m.items() if k.startswith('turns.')})}, "
              f"reward model {m.get('reward_model.reason', 'off')}, KL {m.get('kl', float('nan')):.2f}", flush=True)
    head = store.list("acme", "style")[-1]
    rates = held_out_rate(base, head.path, fam)
    print(f"[{condition}] seed {seed}: head v{head.version} held-out {statistics.mean(rates):.3f} "
          f"(eval seeds {[round(x, 3) for x in rates]})", flush=True)
    return statistics.mean(rates)


def main() -> None:
    from pipelines.models.registry import resolve_base_model
    from pipelines.sim.families import family

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="every-turn-") as tmp:
        root = Path(tmp)
        base = resolve_base_model("tiny", root / "home")
        before = held_out_rate(base, None, family("style"))
        print(f"base model held-out {statistics.mean(before):.3f} (eval seeds {[round(x, 3) for x in before]})")
        results = {c: [run(c, s, base, root) for s in SEEDS] for c in CONDITIONS}
    for c, xs in results.items():
        sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
        print(f"{c}: {' '.join(f'{x:.3f}' for x in xs)}; mean {statistics.mean(xs):.3f} (sd over seeds {sd:.3f})")
    print(f"{len(SEEDS)} seeds x {ITERATIONS} iterations x {SESSIONS} sessions in {time.monotonic() - t0:.0f} s")
    if len(results) == 2:
        print(f"every_turn_gain={statistics.mean(results['every turn']) - statistics.mean(results['labelled-only']):.3f}")


if __name__ == "__main__":
    main()
