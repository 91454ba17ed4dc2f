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

Those are the defaults (`UserModel()`, the `sparse` profile), which keep most turns labelled. The
`realistic` profile (`UserModel.realistic(explicit_rate=0.05)`, issue #41) makes the implicit
behaviour partial and noisy, with fields that are no-ops at their defaults:

- `p_disliked_visible`: only that share of disliked replies is followed by a visible reaction
  (regenerate / complaint / abandonment as above); the rest are met with silence: the user asks the
  next planned question (or, at the last turn, the session ends `completed`);
- `p_liked_abandon`, `p_liked_regenerate`: a liked reply is sometimes followed by abandonment or by a
  regenerate (users explore); otherwise by the next question or the session's end;
- `send_sentiment = False`: the app sends no `follow_up` feedback: a thanks or a complaint is only
  the text of the next user message (the reward stage reads it, pipelines/reward/hindsight.py);
- `reports_task_success = False`: the app does not know whether the task succeeded: the SessionEnd
  carries no task_success;
- `react_when_voted = True`: users behave the same whether they voted (a voter who liked the reply
  may still say thanks), and the app records both the vote and the implicit feedback (the default,
  False, lets the vote replace the regenerate / follow-up event and skips thanks after a vote).

`labelled_share` (pipelines/sim/coverage.py) measures the share of turns a profile labels.

The tools family's app also runs every call the model made and reports its real outcome (a
ToolCall event: ok / invalid_arguments / error), explicit vote or not.

`Session` is the pure state machine both drivers share: `offline.py` steps many sessions in
lockstep (one batched sample per turn) and returns the events an app would emit; `traffic.py` runs
one session per user thread through the gateway. Everything random comes from the session's own
`random.Random`, so a seed reproduces the same users.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

COMPLAINTS = ("That doesn't answer my question.", "Not what I asked.", "That is not helpful.")
THANKS = ("Thanks!", "Great, thank you.", "Perfect, thanks.")


PROFILES = ("sparse", "realistic", "dense")   # UserModel.profile(name): the named user settings
EXPLICIT_RATE_RANGE = (0.01, 1.0)             # the realistic profile's vote-rate knob


@dataclass(frozen=True)
class UserModel:
    """How simulated users react. Defaults (the `sparse` profile): 1 in 5 turns voted, every disliked
    reply followed by a visible reaction, every session end reporting task_success."""

    turns_per_session: tuple[int, int] = (1, 3)  # inclusive range, drawn per session: most chats are short
    explicit_rate: float = 0.2     # share of turns with thumbs; production apps see 1-10%, 0.2 keeps tests fast
    noise: float = 0.0             # probability an explicit vote is flipped
    p_regenerate: float = 0.35     # disliked, visible: hit "regenerate"
    p_complain: float = 0.35       # disliked, visible: a dissatisfied follow-up message
    p_thanks: float = 0.5          # liked, carrying on: the next message starts with thanks (satisfied)
    # the rest of a visible disliked turn's probability (1 - p_regenerate - p_complain = 0.30) is abandonment
    p_disliked_visible: float = 1.0   # disliked: share followed by a visible reaction; the rest: silence
    p_liked_abandon: float = 0.0      # liked: the user leaves anyway (session ends abandoned)
    p_liked_regenerate: float = 0.0   # liked: the user regenerates anyway (to see another answer)
    send_sentiment: bool = True       # the app sends follow_up feedback (sentiment + text); False: none
    reports_task_success: bool = True  # the app knows task success; False: SessionEnd without it
    react_when_voted: bool = False    # True: voters react like everyone else and both events are sent

    def __post_init__(self) -> None:
        lo, hi = self.turns_per_session
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(f"turns_per_session={self.turns_per_session!r}: use (min, max) with 1 <= min <= max")
        for name in ("explicit_rate", "noise", "p_regenerate", "p_complain", "p_thanks",
                     "p_disliked_visible", "p_liked_abandon", "p_liked_regenerate"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name}={v!r}: a probability, must be on [0, 1]")
        if self.noise > 0.5:
            raise ValueError(f"noise={self.noise!r}: above 0.5 votes mean the opposite; use <= 0.5")
        if self.p_regenerate + self.p_complain > 1.0:
            raise ValueError(f"p_regenerate + p_complain = {self.p_regenerate + self.p_complain}: must be <= 1 "
                             "(the rest is abandonment)")
        if self.p_liked_abandon + self.p_liked_regenerate > 1.0:
            raise ValueError(f"p_liked_abandon + p_liked_regenerate = "
                             f"{self.p_liked_abandon + self.p_liked_regenerate}: must be <= 1 "
                             "(the rest carries on)")
        for name in ("send_sentiment", "reports_task_success", "react_when_voted"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be true or false")

    @property
    def p_abandon(self) -> float:
        return 1.0 - self.p_regenerate - self.p_complain

    @classmethod
    def dense(cls) -> "UserModel":
        """One turn, always voted, never abandoned: the proof-of-learning setting. Its events are
        the original single-turn episode's: thumbs +-1, then a completed session whose
        task_success is whether the reply was liked."""
        return cls(turns_per_session=(1, 1), explicit_rate=1.0, p_regenerate=1.0, p_complain=0.0)

    @classmethod
    def realistic(cls, explicit_rate: float = 0.05, **overrides: Any) -> "UserModel":
        """Production-like users (issue #41): votes on `explicit_rate` of turns (0.01..1.0, 5% by
        default), implicit behaviour partial and noisy, follow-ups sent as plain next messages (no
        `follow_up` sentiment), no task_success. `overrides` set any other field (e.g.
        `send_sentiment=True`, `reports_task_success=True` for apps that have them)."""
        lo, hi = EXPLICIT_RATE_RANGE
        if isinstance(explicit_rate, bool) or not isinstance(explicit_rate, (int, float)) \
                or not lo <= explicit_rate <= hi:
            raise ValueError(f"explicit_rate={explicit_rate!r}: the realistic profile's vote rate must be on "
                             f"[{lo}, {hi}] (5% by default; production apps see 1-10%)")
        return cls(**{**REALISTIC, "explicit_rate": float(explicit_rate), **overrides})

    @classmethod
    def profile(cls, name: str, **overrides: Any) -> "UserModel":
        """A named setting: `sparse` (the defaults), `realistic` (`realistic()`), `dense` (`dense()`);
        `overrides` replace fields (`explicit_rate` is the realistic profile's knob)."""
        if name == "sparse":
            return cls(**overrides)
        if name == "realistic":
            return cls.realistic(**overrides)
        if name == "dense":
            return dataclasses.replace(cls.dense(), **overrides)
        raise ValueError(f"user profile {name!r}; choose one of {list(PROFILES)}")


# The realistic profile's behaviour (UserModel.realistic); each value is a judgement, measured in
# docs/learning.md "Realistic users" (labelled share <= 30% at 5% votes).
REALISTIC: dict[str, Any] = dict(
    turns_per_session=(1, 3),
    p_disliked_visible=0.3,   # most disliked replies get no visible reaction: the user just moves on
    p_regenerate=0.35, p_complain=0.45,  # of the visible ones; the rest (0.2) is abandonment
    p_thanks=0.15,            # a liked reply is mostly followed by silence or the next question
    p_liked_abandon=0.05,     # ... sometimes by abandonment (the user got what they needed, or left anyway)
    p_liked_regenerate=0.05,  # ... and some regenerations follow liked replies (exploring)
    send_sentiment=False,     # the next message is only the next message: no follow_up sentiment
    reports_task_success=False,  # most apps do not know whether the task succeeded
    react_when_voted=True,    # a vote does not change what the user does next
)


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
    request: list[dict] = field(default_factory=list)   # the messages the reply answered
    reply: str = ""                # the reply's text


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
        """Record the reply to `messages()` and decide the user's reaction (module docstring).

        At the new fields' defaults this draws from `rng` exactly as before they existed, so a seed
        reproduces the same users."""
        um = self.um
        asked = self.messages()
        idx, last = len(self.turns), len(self.turns) + 1 >= self.max_turns
        voted = self.rng.random() < um.explicit_rate
        rec = TurnRecord(idx, liked, voted, request=asked, reply=reply_text)
        if voted:
            vote = liked if self.rng.random() >= um.noise else not liked
            rec.signals.append(Signal("thumbs", 1.0 if vote else -1.0))
        implicit = not voted or um.react_when_voted   # the implicit events are sent for this turn
        if liked:
            if um.p_liked_abandon > 0 or um.p_liked_regenerate > 0:
                u = self.rng.random()
                rec.action = ("abandon" if u < um.p_liked_abandon else
                              "regenerate" if u < um.p_liked_abandon + um.p_liked_regenerate else "continue")
            if rec.action == "regenerate" and implicit:
                rec.signals.append(Signal("regenerate"))   # the same request again
            elif rec.action == "continue":
                thanks = implicit and self.rng.random() < um.p_thanks
                self._carry_on(rec, asked, reply_text, last, thanks)
        else:
            visible = um.p_disliked_visible >= 1.0 or self.rng.random() < um.p_disliked_visible
            if visible:
                u = self.rng.random()
                rec.action = ("regenerate" if u < um.p_regenerate else
                              "complain" if u < um.p_regenerate + um.p_complain else "abandon")
            else:
                self._carry_on(rec, asked, reply_text, last, thanks=False)   # silence: the next question
            if rec.action == "regenerate":
                if implicit:
                    rec.signals.append(Signal("regenerate"))
                # same request again: history and pending stay as they were
            elif rec.action == "complain":
                question = self._pending[-1]["content"] if self._pending else ""
                text = f"{self.rng.choice(COMPLAINTS)} {question}".strip()
                if implicit and um.send_sentiment:
                    rec.signals.append(Signal("follow_up", sentiment="dissatisfied", text=text))
                self.history = asked + [{"role": "assistant", "content": reply_text}]
                self._pending = [{"role": "user", "content": text}]
        self.turns.append(rec)
        if rec.action == "abandon":
            self.done, self.outcome, self.task_success = True, "abandoned", None
        elif last:
            self.done, self.outcome = True, "completed"
            self.task_success = liked if um.reports_task_success else None
        return rec

    def _carry_on(self, rec: TurnRecord, asked: list[dict], reply_text: str, last: bool, thanks: bool) -> None:
        """The user moves on: the next planned question (opened with thanks if `thanks`), or the end."""
        if last:
            rec.action = "end"
            return
        nxt = self.questions[self._asked]
        self._asked += 1
        lead = self.rng.choice(THANKS) + " " if thanks else ""
        self.history = asked + [{"role": "assistant", "content": reply_text}]
        self._pending = [{**nxt[-1], "content": lead + nxt[-1]["content"]}]
        if thanks and self.um.send_sentiment:
            rec.signals.append(Signal("follow_up", sentiment="satisfied", text=self._pending[0]["content"]))
