"""How many turns a kind of simulated user labels: the share of turns with any reward label.

Pure (no Kafka, no model, no lake): sessions of `UserModel` users are played with replies that
are liked with probability `p_liked` (a family's base rate), and each turn is labelled the way the
reward stage labels it under the default spec (pipelines/reward/sql.py, `labelled`):

- the turn's own feedback: a thumbs vote, a regenerate, a follow_up with a satisfied/dissatisfied
  sentiment;
- the session outcome (`abandon`: the session ended abandoned; `session`: task_success was
  reported), credited to the turns the spec's credit rule gives a share (`discounted` by default:
  gamma 0.5, shares under 0.05 dropped, so a session of <= 5 turns credits every turn).

Not counted: tool outcomes (app-specific: the concise app's SMS tool, the tools family's calls
label more turns) and the dodge rule (empty / clarifying replies are always labelled): both
depend on the replies, not on the users. `tests/sim/test_coverage.py` holds `turn_labels` equal
to the reward engine's `labelled` on the same sessions' events.

`with_next_message`: turns followed by a new user message in the same trace (a thanks, a
complaint, the next question), the text hindsight signals read (pipelines/reward/hindsight.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pipelines.reward import rules
from pipelines.reward.hindsight import next_turn_hindsight
from pipelines.reward.spec import CreditRule, Discounted, LastTurn, RewardSpec, Uniform
from pipelines.sim.sessions import Session, UserModel

LABEL_SOURCES = ("thumbs", "regenerate", "follow_up", "abandon", "session")


def credit_share(rule: CreditRule, turn_index: int, last_index: int) -> float | None:
    """The share of a session outcome turn `turn_index` gets (None: no credit), as sql.py computes it."""
    if isinstance(rule, LastTurn):
        return 1.0 if turn_index == last_index else None
    if isinstance(rule, Uniform):
        return 1.0
    if isinstance(rule, Discounted):
        share = rule.gamma ** (last_index - turn_index)
        return share if share >= rule.min_share else None
    raise TypeError(f"unknown credit rule {rule!r}")


def _last_user(request: list) -> str | None:
    for m in reversed(request):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else None
    return None


def turn_labels(session: Session, credit: CreditRule | None = None, hindsight: bool = False) -> list[set[str]]:
    """Per turn of an ended `session`: the sources (LABEL_SOURCES) that label it. `hindsight`: also
    the built-in spec's `hindsight` component (the next user message of the trace, as the reward
    engine pairs and classifies it: source "hindsight"); off by default, so the figures in
    docs/learning.md stay those of the signals users send."""
    if not session.done:
        raise ValueError("the session has not ended: its outcome labels are not known yet")
    spec = RewardSpec()
    credit = credit if credit is not None else spec.credit
    last = len(session.turns) - 1
    hs = next_turn_hindsight(
        {"tenant": "", "trace_id": "", "turn_id": i, "turn_index": t.turn_index, "turn_time": i,
         "user_text": _last_user(t.request), "out_text": t.reply} for i, t in enumerate(session.turns)) \
        if hindsight else {}
    out = []
    for i, t in enumerate(session.turns):
        got: set[str] = set()
        h = hs.get(("", "", i))
        if h is not None:
            follow = [g.sentiment for g in t.signals
                      if g.kind == "follow_up" and g.sentiment in ("satisfied", "dissatisfied")]
            if rules.hindsight(h.kind, h.confidence, any(g.kind == "regenerate" for g in t.signals),
                               follow[-1] if follow else None, spec) is not None:
                got.add("hindsight")
        for g in t.signals:
            if g.kind == "thumbs" and g.value:
                got.add("thumbs")
            elif g.kind == "regenerate":
                got.add("regenerate")
            elif g.kind == "follow_up" and g.sentiment in ("satisfied", "dissatisfied"):
                got.add("follow_up")
        if credit_share(credit, t.turn_index, last) is not None:
            if session.outcome == "abandoned":
                got.add("abandon")
            if session.task_success is not None:
                got.add("session")
        out.append(got)
    return out


def has_next_message(session: Session, i: int) -> bool:
    """Turn i is followed by a new user message of the same trace (not a regenerate of it)."""
    if i + 1 >= len(session.turns):
        return False
    nxt = session.turns[i + 1].request
    here = session.turns[i]
    return len(nxt) > len(here.request) and nxt[len(here.request)].get("content") == here.reply


@dataclass
class Coverage:
    """What share of turns users of one kind label (`labelled_share`)."""

    p_liked: float
    sessions: int
    turns: int
    labelled: float                 # share of turns with any label (the reward stage's `labelled`)
    turn_level: float               # ... by a feedback on the turn itself (thumbs, regenerate, follow_up)
    voted: float                    # ... with a thumbs vote
    positive: float                 # ... with a positive signal (thumbs up, satisfied follow-up, task success)
    with_next_message: float        # share followed by a new user message (hindsight can read it)
    unlabelled_with_next: float     # unlabelled turns that have a next message: what hindsight adds
    by_source: dict[str, float] = field(default_factory=dict)   # share of turns each source labels

    def row(self) -> str:
        src = " ".join(f"{k} {v:.3f}" for k, v in self.by_source.items())
        return (f"p_liked {self.p_liked:.2f}: {self.turns} turns, labelled {self.labelled:.3f} "
                f"(turn-level {self.turn_level:.3f}, voted {self.voted:.3f}, positive {self.positive:.3f}; {src}), "
                f"next message {self.with_next_message:.3f}, unlabelled with a next message "
                f"{self.unlabelled_with_next:.3f}")


def play(um: UserModel, p_liked: float, sessions: int, seed: int = 0, pool_size: int = 24) -> list[Session]:
    """`sessions` ended sessions of `um` users whose replies are liked with probability `p_liked`."""
    if not 0.0 <= p_liked <= 1.0:
        raise ValueError(f"p_liked={p_liked!r}: a probability, must be on [0, 1]")
    pool = [[{"role": "user", "content": f"question {i} about topic {i}"}] for i in range(pool_size)]
    rng, out = random.Random(seed), []
    for i in range(sessions):
        s = Session.start(pool, pool[i % len(pool)], um, random.Random(rng.getrandbits(64)))
        while not s.done:
            s.messages()
            s.observe(f"reply {i}.{len(s.turns)}", rng.random() < p_liked)
        out.append(s)
    return out


def labelled_share(um: UserModel, p_liked: float, sessions: int = 4000, seed: int = 0,
                   credit: CreditRule | None = None) -> Coverage:
    """The share of turns with any label when `um` users meet replies liked with probability
    `p_liked`, under `credit` (default: the built-in spec's rule). Deterministic for a seed."""
    played = play(um, p_liked, sessions, seed)
    n = labelled = turn_level = voted = positive = nxt = unl_nxt = 0
    by = dict.fromkeys(LABEL_SOURCES, 0)
    for s in played:
        for i, (t, got) in enumerate(zip(s.turns, turn_labels(s, credit))):
            n += 1
            labelled += bool(got)
            turn_level += bool(got & {"thumbs", "regenerate", "follow_up"})
            voted += t.voted
            positive += any((g.value or 0) > 0 or g.sentiment == "satisfied" for g in t.signals) \
                or ("session" in got and s.task_success is True)
            follows = has_next_message(s, i)
            nxt += follows
            unl_nxt += follows and not got
            for k in got:
                by[k] += 1
    n = max(n, 1)
    return Coverage(p_liked, sessions, n, labelled / n, turn_level / n, voted / n, positive / n, nxt / n, unl_nxt / n,
                    {k: v / n for k, v in by.items()})


def main() -> None:  # pragma: no cover - the figures in docs/learning.md "Realistic users"
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="realistic")
    ap.add_argument("--explicit-rate", type=float, default=None)
    ap.add_argument("--sessions", type=int, default=20000)
    ap.add_argument("--rates", default="0.02,0.05,0.1,0.2,0.3,0.4,0.5")
    a = ap.parse_args()
    um = UserModel.profile(a.profile, **({} if a.explicit_rate is None else {"explicit_rate": a.explicit_rate}))
    print(um)
    for r in (float(x) for x in a.rates.split(",")):
        print(labelled_share(um, r, a.sessions).row())


if __name__ == "__main__":  # pragma: no cover
    main()
