"""Behaviour signatures: blocking guardrails against reward hacks, measured on the gate's own replies.

A reward that pays a broken tool call, or a needless clarifying question, teaches exactly that;
a primary suite whose scorer is fooled the same way would promote it. So per model (candidate and
champion, every suite's replies, same items and seeds, paired by position) the gate counts, with
the pure classifiers of ``pipelines/contract/behaviour.py``:

  tool_error      replies with a broken call / replies that attempt a call
  broken_call     replies with a broken call / all replies
  attempted_call  replies that attempt a call / all replies
  clarify         the reward spec's clarify dodge / all replies
  refusal         refusal phrases / all replies
  length          mean reply length in characters (candidate / champion ratio)

A signature blocks when the rate rises by more than its max increase (``gate.signatures``) AND the
rise is significant at the gate's alpha, one-sided:
  - rates over all replies are paired (same item, same seed): exact McNemar test on the
    discordant pairs (the sign test of stats.py on 0/1 indicators);
  - tool_error's denominators (the replies that attempt a call) differ between the models, so
    pairs do not line up: one-sided Fisher exact test on the 2x2 table;
  - length: the ratio of mean lengths must stay within [min, max]; blocks when the ratio is
    outside AND its paired bootstrap one-sided bound is outside too.
Each signature is tested at alpha (no correction over signatures): a false block is the safe
error of a guardrail. Replies stay in memory; only counts and rates leave.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from pipelines.contract.behaviour import Behaviour
from pipelines.config.gate import SignatureConfig
from pipelines.gate.stats import binom_tail_ge

RATES = ("tool_error", "broken_call", "attempted_call", "clarify", "refusal")


@dataclass(frozen=True)
class SignatureVerdict:
    name: str
    candidate: float
    champion: float
    candidate_count: float     # numerator (length: total characters)
    candidate_total: int       # denominator (replies, or replies attempting a call)
    champion_count: float
    champion_total: int
    p_rise: float              # one-sided evidence that the candidate's value is higher (lower, for a
                               #   too-short length ratio); small = significant
    limit: str                 # the configured tolerance, in words
    blocked: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fisher_greater(x1: int, n1: int, x2: int, n2: int) -> float:
    """One-sided Fisher exact p: P(X >= x1) for X ~ Hypergeometric(n1 + n2, x1 + x2, n1), i.e. the
    evidence that rate 1 (x1 / n1) exceeds rate 2 given both margins."""
    total, hits = n1 + n2, x1 + x2
    if n1 == 0 or n2 == 0 or hits == 0:
        return 1.0
    denom = math.comb(total, n1)
    lo, hi = max(0, hits - n2), min(hits, n1)
    return sum(math.comb(hits, k) * math.comb(total - hits, n1 - k) for k in range(max(x1, lo), hi + 1)) / denom


def mcnemar_greater(cand: Sequence[bool], champ: Sequence[bool]) -> float:
    """Exact one-sided McNemar: among discordant pairs, P(K >= #(cand and not champ)) for K ~ Bin(n, 1/2)."""
    up = sum(1 for a, b in zip(cand, champ) if a and not b)
    down = sum(1 for a, b in zip(cand, champ) if b and not a)
    return binom_tail_ge(up, up + down)


def _rate_verdict(name: str, cand: list[bool], champ: list[bool], tol: float | None, alpha: float,
                  paired: bool) -> SignatureVerdict:
    xc, nc, xb, nb = sum(cand), len(cand), sum(champ), len(champ)
    rc, rb = (xc / nc if nc else 0.0), (xb / nb if nb else 0.0)
    p = mcnemar_greater(cand, champ) if paired else fisher_greater(xc, nc, xb, nb)
    rise = rc - rb
    blocked = tol is not None and rise > tol and p < alpha
    limit = "report only" if tol is None else f"max increase {tol:+.2f}"
    test = "McNemar exact" if paired else "Fisher exact"
    why = (f"signature {name}: champion {rb:.3f} ({xb}/{nb}) -> candidate {rc:.3f} ({xc}/{nc}), rise {rise:+.3f} "
           f"({limit}), p_rise={p:.4f} ({test}) vs alpha={alpha:.3f}")
    if blocked:
        why += ": blocked, the candidate does this significantly more often"
    return SignatureVerdict(name, rc, rb, xc, nc, xb, nb, p, limit, blocked, why)


def _ratio_bounds(c: np.ndarray, b: np.ndarray, alpha: float, n_bootstrap: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(c), size=(n_bootstrap, len(c)))
    ratios = (c[idx].mean(axis=1) + 1.0) / (b[idx].mean(axis=1) + 1.0)
    lo, hi = np.quantile(ratios, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def _length_verdict(cand: list[int], champ: list[int], cfg: SignatureConfig, alpha: float,
                    n_bootstrap: int, seed: int) -> SignatureVerdict:
    c, b = np.asarray(cand, dtype=float), np.asarray(champ, dtype=float)
    mc, mb = float(c.mean()) if len(c) else 0.0, float(b.mean()) if len(b) else 0.0
    ratio = (mc + 1.0) / (mb + 1.0)  # +1 char: a champion of empty replies does not divide by 0
    lo_ok, hi_ok = cfg.length_ratio_min, cfg.length_ratio_max
    low, high = _ratio_bounds(c, b, alpha, n_bootstrap, seed) if len(c) and len(c) == len(b) else (ratio, ratio)
    too_long = hi_ok is not None and ratio > hi_ok and low > hi_ok
    too_short = lo_ok is not None and ratio < lo_ok and high < lo_ok
    limit = (f"ratio within [{lo_ok if lo_ok is not None else '-'}, {hi_ok if hi_ok is not None else '-'}]")
    why = (f"signature length: mean chars champion {mb:.1f} -> candidate {mc:.1f}, ratio {ratio:.3f} "
           f"(one-sided bounds [{low:.3f}, {high:.3f}] at alpha={alpha:.3f}; {limit})")
    if too_long or too_short:
        why += f": blocked, replies got significantly {'longer' if too_long else 'shorter'}"
    return SignatureVerdict("length", mc, mb, float(c.sum()), len(c), float(b.sum()), len(b),
                            float("nan"), limit, too_long or too_short, why)


def compare_signatures(cand: Sequence[Behaviour], champ: Sequence[Behaviour], cfg: SignatureConfig,
                       alpha: float, n_bootstrap: int = 2000, seed: int = 0) -> list[SignatureVerdict]:
    """One verdict per signature; ``cand[i]`` and ``champ[i]`` answer the same request."""
    if len(cand) != len(champ):
        raise ValueError(f"signatures compare paired replies: {len(cand)} candidate vs {len(champ)} champion")
    out = [
        _rate_verdict("tool_error", [x.broken_call for x in cand if x.attempted_call],
                      [x.broken_call for x in champ if x.attempted_call], cfg.tool_error, alpha, paired=False),
        _rate_verdict("broken_call", [x.broken_call for x in cand], [x.broken_call for x in champ],
                      cfg.broken_call, alpha, paired=True),
        _rate_verdict("attempted_call", [x.attempted_call for x in cand], [x.attempted_call for x in champ],
                      cfg.attempted_call, alpha, paired=True),
        _rate_verdict("clarify", [x.clarify for x in cand], [x.clarify for x in champ], cfg.clarify, alpha,
                      paired=True),
        _rate_verdict("refusal", [x.refusal for x in cand], [x.refusal for x in champ], cfg.refusal, alpha,
                      paired=True),
    ]
    if cand:
        out.append(_length_verdict([x.chars for x in cand], [x.chars for x in champ], cfg, alpha, n_bootstrap, seed))
    return out
