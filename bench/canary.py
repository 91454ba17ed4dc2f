"""How many live turns does the canary need to decide, against a fixed-horizon test at equal power?

Simulated users with a hidden preference: each turn, a user likes the reply with the arm's
probability (champion BASE; a challenger with a known true gain, BASE + EFFECT, or a known loss,
BASE - EFFECT). Feedback is as sparse as production's: an explicit thumb on EXPLICIT of the turns
(+1 liked, -1 not); on the others a disliked reply is regenerated half the time (-0.5) and
anything else says nothing (0). Sessions have 1-3 turns; a session's reward is its turns' mean,
one observation, as in the lake (pipelines/canary/sessions.py). The challenger gets the shipped
default share of conversations (canary.share), and the canary's shipped decision rule
(pipelines/canary/decide.py, CanaryConfig() defaults) is checked after every batch of BATCH
sessions until it promotes, rolls back or expires.

The fixed-horizon test it is compared with: a one-sided z-test of the difference of the two
arms' session means at the same alpha (alpha for a promotion; alpha / (k + 1) for a rollback,
as the canary splits it over the reward and k guardrails), sized for the power the canary
reached on that case (all of n canaries right reads as power 1 - 1/n; the conventional 80% design
is printed beside it), with the true effect and the true per-arm variances known (an oracle
fixed design: the most favourable to it).

    .venv/bin/python bench/canary.py
Last line: canary_turns_vs_fixed=<mean turns the canary needed on the true-gain case / the fixed
test's turns at equal power>. Target <= 0.7.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.canary.decide import CONTINUE, Session, decide  # noqa: E402
from pipelines.config.canary import CanaryConfig  # noqa: E402

BASE, EFFECT, EXPLICIT = 0.20, 0.10, 0.20
BATCH = 50
CANARIES = int(os.environ.get("TRACERL_CANARY_RUNS", "400"))


def sessions(rng: np.random.Generator, n: int, liked_rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(reward, turns) of ``n`` sessions whose turns are liked at ``liked_rate``."""
    turns = rng.integers(1, 4, size=n)
    total = np.zeros(n)
    for k in range(3):
        live = turns > k
        liked = rng.random(n) < liked_rate
        explicit = rng.random(n) < EXPLICIT
        regen = rng.random(n) < 0.5
        r = np.where(explicit, np.where(liked, 1.0, -1.0), np.where(~liked & regen, -0.5, 0.0))
        total += np.where(live, r, 0.0)
    return total / turns, turns


def run_canary(rng: np.random.Generator, cfg: CanaryConfig, challenger_rate: float) -> tuple[str, int, int]:
    """(outcome, sessions, turns) of one simulated canary checked after every batch."""
    seen: list[Session] = []
    turns = 0
    while True:
        a = (rng.random(BATCH) < cfg.share).astype(int)
        r1, t1 = sessions(rng, BATCH, challenger_rate)
        r0, t0 = sessions(rng, BATCH, BASE)
        seen.extend(Session(int(k), float(v)) for k, v in zip(a, np.where(a == 1, r1, r0)))
        turns += int(np.where(a == 1, t1, t0).sum())
        d = decide(seen, cfg, hours=0.0)
        if d.outcome != CONTINUE:
            return d.outcome, len(seen), turns


def fixed_turns(rng: np.random.Generator, cfg: CanaryConfig, challenger_rate: float, alpha: float,
                power: float) -> float:
    """Turns a one-sided z-test at ``alpha`` needs for ``power`` at the true effect (oracle design)."""
    from statistics import NormalDist

    r1, t1 = sessions(rng, 400_000, challenger_rate)
    r0, t0 = sessions(rng, 400_000, BASE)
    delta = abs(r1.mean() - r0.mean())
    var = r1.var() / cfg.share + r0.var() / (1 - cfg.share)  # per session of traffic, split at the share
    z = NormalDist().inv_cdf
    n = (z(1 - alpha) + z(power)) ** 2 * var / delta ** 2
    return n * (cfg.share * t1.mean() + (1 - cfg.share) * t0.mean())


def main() -> None:
    cfg = CanaryConfig()
    k = len(cfg.guardrails)
    rng = np.random.default_rng(0)
    print(f"users: base liked rate {BASE}, challenger {BASE + EFFECT:.2f} (gain) or {BASE - EFFECT:.2f} (loss); "
          f"explicit feedback on {EXPLICIT:.0%} of turns; share {cfg.share}; alpha {cfg.alpha}; "
          f"checked every {BATCH} sessions; {CANARIES} canaries per case ({max(CANARIES // 4, 10)} A/A)", flush=True)
    ratios = {}
    for case, rate, want, alpha in (("gain", BASE + EFFECT, "promote", cfg.alpha),
                                    ("loss", BASE - EFFECT, "rollback", cfg.alpha / (k + 1)),
                                    ("A/A", BASE, None, cfg.alpha)):
        t0 = time.monotonic()
        n = CANARIES if want else max(CANARIES // 4, 10)  # A/A canaries run to max_sessions: fewer of them
        runs = [run_canary(rng, cfg, rate) for _ in range(n)]
        outcomes = [o for o, _, _ in runs]
        turns = [t for _, _, t in runs]
        if want is None:
            wrong = sum(o in ("promote", "rollback") for o in outcomes)
            print(f"{case}: {wrong}/{n} false decisions (promote {outcomes.count('promote')}, rollback "
                  f"{outcomes.count('rollback')}), mean {statistics.mean(turns):.0f} turns "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
            continue
        # the power it reached; all n right reads as 1 - 1/n (a fixed test cannot be sized for power 1)
        power = min(outcomes.count(want) / n, 1 - 1 / n)
        fixed = fixed_turns(rng, cfg, rate, alpha, power)
        fixed80 = fixed_turns(rng, cfg, rate, alpha, 0.8)
        ratios[case] = statistics.mean(turns) / fixed
        print(f"{case}: {want} in {outcomes.count(want)}/{n} (power {power:.3f}); turns to decide: mean "
              f"{statistics.mean(turns):.0f}, median {statistics.median(turns):.0f}, p90 "
              f"{sorted(turns)[int(0.9 * len(turns)) - 1]}; fixed-horizon z-test at alpha {alpha:.4f}: "
              f"{fixed:.0f} turns at power {power:.3f} (ratio {ratios[case]:.2f}), {fixed80:.0f} at power 0.8 "
              f"(mean / it {statistics.mean(turns) / fixed80:.2f}, median / it "
              f"{statistics.median(turns) / fixed80:.2f}) ({time.monotonic() - t0:.0f} s)", flush=True)
    print(f"canary_turns_vs_fixed={ratios['gain']:.3f}")


if __name__ == "__main__":
    main()
