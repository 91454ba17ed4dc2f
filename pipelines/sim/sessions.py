"""Multi-turn sessions of simulated users, with sparse explicit feedback and implicit signals.

A session is a few turns (`turns_per_session`). After each reply the user decides, by the hidden
preference (families.py), what to do next, and only some of them say so explicitly:

- a vote: with probability `explicit_rate` the turn gets thumbs (+1 liked / -1 disliked), flipped
  with probability `noise` (users misclick, or vote on something else);
- a disliked reply without a vote gets one implicit negative, what the user would do:
  regenerate (`p_regenerate`: a `regenerate` feedback, the same question is asked again), a
  dissatisfied follow-up (`p_complain`: a `follow_up` feedback, sentiment dissatisfied, whose text is
  the next message), or abandonment (the rest: the session ends `abandoned`). A voter who disliked
  the reply acts the same way (the session goes on the same), only the vote replaces the
  regenerate / follow-up feedback;
- a liked reply continues the session: without a vote, with probability `p_thanks` the next message
  starts with thanks (a `follow_up`, sentiment satisfied), else it just asks the next question
  (no signal: the reward engine sees only the session outcome);
- a session that runs to its last turn ends `completed` with task_success = whether the last reply
  was liked; an abandoned one ends with task_success unknown (None).

The tools family's app also runs every call the model made and reports its real outcome (a
ToolCall event: ok / invalid_arguments / error), explicit vote or not.

`Session` is the pure state machine both drivers share: `loop.py` steps many sessions in
lockstep (one batched sample per turn) and emits events with TraceProducer; `traffic.py` runs
one session per user thread through the gateway. Everything random comes from the session's own
`random.Random`, so a seed reproduces the same users.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

COMPLAINTS = ("That doesn't answer my question.", "Not what I asked.", "That is not helpful.")
THANKS = ("Thanks!", "Great, thank you.", "Perfect, thanks.")


@dataclass(frozen=True)
class UserModel:
    """How simulated users react. Defaults: realistic sparse feedback (1 in 5 turns voted)."""

    turns_per_session: tuple[int, int] = (1, 3)  # inclusive range, drawn per session: most chats are short
    explicit_rate: float = 0.2     # share of turns with thumbs; production apps see 1-10%, 0.2 keeps tests fast
    noise: float = 0.0             # probability an explicit vote is flipped
    p_regenerate: float = 0.35     # disliked, no vote: hit "regenerate"
    p_complain: float = 0.35       # disliked, no vote: a dissatisfied follow-up message
    p_thanks: float = 0.5          # liked, no vote: the next message starts with thanks (satisfied)
    # the rest of a disliked turn's probability (1 - p_regenerate - p_complain = 0.30) is abandonment

    def __post_init__(self) -> None:
        lo, hi = self.turns_per_session
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(f"turns_per_session={self.turns_per_session!r}: use (min, max) with 1 <= min <= max")
        for name in ("explicit_rate", "noise", "p_regenerate", "p_complain", "p_thanks"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name}={v!r}: a probability, must be on [0, 1]")
        if self.noise > 0.5:
            raise ValueError(f"noise={self.noise!r}: above 0.5 votes mean the opposite; use <= 0.5")
        if self.p_regenerate + self.p_complain > 1.0:
            raise ValueError(f"p_regenerate + p_complain = {self.p_regenerate + self.p_complain}: must be <= 1 "
                             "(the rest is abandonment)")

    @property
    def p_abandon(self) -> float:
        return 1.0 - self.p_regenerate - self.p_complain

    @classmethod
    def dense(cls) -> "UserModel":
        """One turn, always voted, never abandoned: the proof-of-learning setting. Its events are
        the original single-turn episode's: thumbs +-1, then a completed session whose
        task_success is whether the reply was liked."""
        return cls(turns_per_session=(1, 1), explicit_rate=1.0, p_regenerate=1.0, p_complain=0.0)


@dataclass
class Signal:
    """One feedback the user gives about a turn (Feedback event fields)."""

    kind: str                      # thumbs | regenerate | follow_up
    value: float | None = None
    sentiment: str | None = None
    text: str | None = None


@dataclass
class TurnRecord:
    """What happened at one turn: the user's verdict, vote and signals."""

    turn_index: int
    liked: bool
    voted: bool
    signals: list[Signal] = field(default_factory=list)
    action: str = "continue"       # continue | regenerate | complain | abandon | end


@dataclass
class Session:
    """One user's conversation. `messages()` is the next request; `observe(reply_text, liked)`
    records the reply and the user's reaction; `done` once it ended, then `outcome` and
    `task_success` describe the SessionEnd."""

    questions: list[list[dict]]    # the user's planned questions, the first one opens the session
    um: UserModel
    rng: random.Random
    history: list[dict] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    done: bool = False
    outcome: str = "completed"
    task_success: bool | None = None
    _pending: list[dict] = field(default_factory=list)   # the next user message(s) to send
    _asked: int = 0                # planned questions used so far

    @classmethod
    def start(cls, pool: list[list[dict]], first: list[dict], um: UserModel, rng: random.Random) -> "Session":
        """A session opened by `first`; later questions are drawn from `pool` (same split)."""
        n = rng.randint(*um.turns_per_session)
        questions = [first] + [pool[rng.randrange(len(pool))] for _ in range(n - 1)]
        s = cls(questions, um, rng)
        s._pending, s._asked = list(first), 1
        return s

    @property
    def max_turns(self) -> int:
        return len(self.questions)

    def messages(self) -> list[dict]:
        if self.done:
            raise RuntimeError("the session has ended: no next request")
        return self.history + self._pending

    def observe(self, reply_text: str, liked: bool) -> TurnRecord:
        """Record the reply to `messages()` and decide the user's reaction (module docstring)."""
        asked = self.messages()
        idx, last = len(self.turns), len(self.turns) + 1 >= self.max_turns
        voted = self.rng.random() < self.um.explicit_rate
        rec = TurnRecord(idx, liked, voted)
        if voted:
            vote = liked if self.rng.random() >= self.um.noise else not liked
            rec.signals.append(Signal("thumbs", 1.0 if vote else -1.0))
        if liked:
            thanks = not voted and self.rng.random() < self.um.p_thanks
            if last:
                rec.action = "end"
            else:
                nxt = self.questions[self._asked]
                self._asked += 1
                lead = self.rng.choice(THANKS) + " " if thanks else ""
                self.history = asked + [{"role": "assistant", "content": reply_text}]
                self._pending = [{**nxt[-1], "content": lead + nxt[-1]["content"]}]
                if thanks:
                    rec.signals.append(Signal("follow_up", sentiment="satisfied", text=self._pending[0]["content"]))
        else:
            u = self.rng.random()
            rec.action = ("regenerate" if u < self.um.p_regenerate else
                          "complain" if u < self.um.p_regenerate + self.um.p_complain else "abandon")
            if rec.action == "regenerate":
                if not voted:
                    rec.signals.append(Signal("regenerate"))
                # same request again: history and pending stay as they were
            elif rec.action == "complain":
                question = self._pending[-1]["content"] if self._pending else ""
                text = f"{self.rng.choice(COMPLAINTS)} {question}".strip()
                if not voted:
                    rec.signals.append(Signal("follow_up", sentiment="dissatisfied", text=text))
                self.history = asked + [{"role": "assistant", "content": reply_text}]
                self._pending = [{"role": "user", "content": text}]
        self.turns.append(rec)
        if rec.action == "abandon":
            self.done, self.outcome, self.task_success = True, "abandoned", None
        elif last:
            self.done, self.outcome, self.task_success = True, "completed", liked
        return rec
