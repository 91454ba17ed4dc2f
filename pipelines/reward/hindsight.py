"""Hindsight signals: what the user's next message in the same trace says about the previous reply.

Most turns carry no explicit label (issue #41), but most conversations go on: the next user message
tells how the previous reply landed. `classify(next_message, previous_message, reply)` reads it:

| kind        | the next message                                                 | value (x confidence) |
|-------------|------------------------------------------------------------------|----------------------|
| `complaint` | a complaint or correction ("Not what I asked.", "That's wrong")  | -1                   |
| `reask`     | the same question again, or a rephrase of it (high overlap)      | -1                   |
| `thanks`    | thanks or approval ("Thanks!", "Perfect, thanks.")               | +1                   |
| `new_topic` | a different question, no cue (the user moved on)                 | +0.25                |
| `none`      | nothing to read (no next message, or no text in it)              | 0                    |

Each comes with a confidence on [0, 1]; `Hindsight.value` = the kind's value x confidence, on
[-1, 1]. A complaint or correction cue wins over thanks ("Thanks, but that's wrong" is a
complaint), and cues win over similarity: a complaint that repeats the question is a complaint
(its confidence rises a little).

Method, deliberately small and CPU-only: lexicons of complaint and thanks phrases (English, plus
common thanks in a few languages), matched on NFKC-casefolded text on word boundaries; the weak
ones ("no", "great") only at the start of the message. Similarity to the previous question is the
larger of the Jaccard overlap of their content words (stop words and generic request words such as
"tell", "help", "explain" removed, light suffix stripping), the share of the previous question's content words the new
message repeats (when it has at least 4 and the share is at least 3/4: a complaint that quotes the
question), and, when one side is a single "word" (scripts written without spaces, one-word
messages), the Jaccard overlap of character bigrams. No model, no new dependency: rapidfuzz is not installed and
stdlib sets are enough for token overlap. Total on any text: never raises, deterministic.

`trace_hindsight(turns)` applies it along a trace (a turn whose next request is the same request
again is a regenerate: `reask` with confidence 1, cue `<same request>`), and `calibrate(signals,
votes)` measures each kind's agreement with explicit votes on the same turns and suggests a weight.
`next_turn_hindsight(turns)` is the reward stage's pairing of each model turn with the next turn of
its trace (the spec's `hindsight` component, `reward/engine.py`): docs/rewards.md "Hindsight
signals"; figures in docs/learning.md "Realistic users".
"""

from __future__ import annotations

import logging
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence

KINDS = ("complaint", "reask", "thanks", "new_topic", "none")
VALUES = {"complaint": -1.0, "reask": -1.0, "thanks": 1.0, "new_topic": 0.25, "none": 0.0}
REASK_MIN = 0.6          # similarity to the previous question from which the next message is a re-ask
CONTAINMENT_MIN_WORDS = 4  # the previous question needs this many content words for containment to count
CONTAINMENT_MIN_SHARE = 0.75  # ...and the new message must repeat this share of them

# Complaint / correction cues, matched anywhere on word boundaries: phrase -> confidence.
_COMPLAINT = {
    **dict.fromkeys((
        "doesn't answer", "does not answer", "didn't answer", "did not answer", "not answer my",
        "not what i asked", "not what i meant", "not what i wanted", "not what i need",
        "that's not what", "that is not what", "thats not what", "not helpful", "isn't helpful",
        "unhelpful", "useless", "that's wrong", "that is wrong", "thats wrong", "you're wrong",
        "you are wrong", "that's incorrect", "that is incorrect", "not correct", "not right",
        "you misunderstood", "misunderstood my", "answer my question", "answer the question",
        "makes no sense", "doesn't make sense", "does not make sense", "wrong answer", "not even close",
        "still wrong", "irrelevant", "nonsense", "you didn't read", "read my question", "that's not it",
        "not true", "you ignored", "ignored my", "not what i was asking", "off topic", "this is wrong",
        "that was wrong", "not useful", "i already asked", "i already said"), 0.9),
    **dict.fromkeys((
        "i asked", "i said", "i meant", "i was asking", "once more", "try again", "that's not",
        "that is not", "this is not", "you didn't", "you did not", "too long", "too short", "too vague",
        "not clear", "why did you", "what do you mean", "huh"), 0.75),
}
# Weak complaint cues: only as the message's first word(s).
_COMPLAINT_START = dict.fromkeys(("no", "nope", "nah", "actually", "ugh", "hmm", "seriously", "come on",
                                  "wrong", "incorrect", "unclear", "confusing"), 0.6)
# Thanks / approval: phrase -> (confidence anywhere, confidence among the first four words).
_THANKS = {
    **dict.fromkeys((
        "thanks", "thank you", "thank u", "thx", "tysm", "many thanks", "much appreciated", "appreciate it",
        "i appreciate", "that helps", "that helped", "this helps", "very helpful", "so helpful",
        "that worked", "it worked", "works now", "merci", "danke", "gracias", "grazie", "obrigado",
        "obrigada", "спасибо", "dank je", "dankjewel"), (0.7, 0.9)),
    **dict.fromkeys((  # approval words count only at the start ("great, now ...")
        "great", "perfect", "awesome", "excellent", "brilliant", "nice", "cool", "exactly", "got it",
        "makes sense", "love it", "ty", "cheers", "good answer", "sounds good"), (0.0, 0.75)),
}
# Matched as substrings (scripts written without spaces, emoji): text -> (anywhere, at start).
_THANKS_SUBSTR = {
    **dict.fromkeys(("ありがとう", "谢谢", "謝謝", "감사합니다", "고맙습니다"), (0.7, 0.9)),
    **dict.fromkeys(("\U0001f44d", "\U0001f64f", "\u2764"), (0.6, 0.7)),   # thumbs up, folded hands, heart
}
# thumbs down, angry face, eye roll, pouting face
_COMPLAINT_SUBSTR = dict.fromkeys(("\U0001f44e", "\U0001f620", "\U0001f644", "\U0001f621"), 0.7)

STOP_WORDS = frozenset("""
a about above after again against all am an and any are as at be been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here
hers him his how i if in into is it its itself just let me more most my no nor not now of off on once only
or other our out over own please same she should so some such than that that's the their them then there
these they this those through to too under until up very was we were what what's when where which while who
whom why will with would you your yours i'm i've i'd it's don't doesn't isn't can't won't
tell help explain know want need give show say said ask asked question quick advice tip plan
thing things something anything get got make like also still really okay ok hi hello hey right today
""".split())

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})


def _norm(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold().translate(_APOSTROPHES)


def _alternation(phrases: Iterable[str], start: bool = False) -> re.Pattern[str]:
    """One pattern for all `phrases` on word boundaries, matched at every word start (a zero-width
    lookahead, so overlapping phrases all count: "that is not helpful" finds "that is not" and "not
    helpful"); longest first at one place. `start`: only at the start of the text."""
    alts = "|".join(re.escape(p) for p in sorted({_norm(p) for p in phrases}, key=lambda p: (-len(p), p)))
    return re.compile((r"^" if start else r"(?<![\w'])") + r"(?=(" + alts + r")(?![\w']))")


_COMPLAINT_RE = _alternation(_COMPLAINT)
_COMPLAINT_START_RE = _alternation(_COMPLAINT_START, start=True)
_THANKS_RE = _alternation(_THANKS)
_COMPLAINT_N = {_norm(k): v for k, v in _COMPLAINT.items()}
_COMPLAINT_START_N = {_norm(k): v for k, v in _COMPLAINT_START.items()}
_THANKS_N = {_norm(k): v for k, v in _THANKS.items()}


def words(text: str) -> list[str]:
    """The normalized words of `text` (letters and digits, inner apostrophes kept)."""
    return _WORD.findall(_norm(text))


def _stem(w: str) -> str:
    """A light English suffix strip, so that "resets", "resetting" and "reset" are one word."""
    for suffix in ("'s", "ing", "ed", "es", "s"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and not w.endswith("ss"):
            w = w[: -len(suffix)]
            if suffix in ("ing", "ed") and len(w) >= 4 and w[-1] == w[-2] and w[-1] not in "aeiouls":
                w = w[:-1]   # running -> run, stopped -> stop (not called -> cal)
            break
    return w


def content_words(text: str) -> list[str]:
    """The words that carry the question's topic: stop words and generic request words removed,
    light-stemmed."""
    return [_stem(w) for w in words(text) if w not in STOP_WORDS]


def _bigrams(ws: Sequence[str]) -> set[str]:
    s = " ".join(ws)
    return {s[i:i + 2] for i in range(len(s) - 1)} if len(s) >= 2 else ({s} if s else set())


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


def similarity(a: str | None, b: str | None) -> float:
    """How much `b` repeats `a`, on [0, 1] (module docstring): 1 for the same question."""
    wa, wb = content_words(a or ""), content_words(b or "")
    if not wa or not wb:   # no content words: only the very same words count as the same question
        same = words(a or "")
        return 1.0 if same and same == words(b or "") else 0.0
    sa, sb = set(wa), set(wb)
    sim = _jaccard(sa, sb)
    if min(len(sa), len(sb)) == 1:   # one "word" on a side: a script without spaces, or a one-word message
        sim = max(sim, _jaccard(_bigrams(wa), _bigrams(wb)))
    if len(sa) >= CONTAINMENT_MIN_WORDS and len(sa & sb) >= CONTAINMENT_MIN_SHARE * len(sa):
        sim = max(sim, len(sa & sb) / len(sa))
    return min(1.0, max(0.0, sim))


@dataclass(frozen=True)
class Hindsight:
    """How the next user message says the previous reply landed."""

    kind: str                  # one of KINDS
    confidence: float          # on [0, 1]
    similarity: float = 0.0    # of the next message to the previous question, on [0, 1]
    cue: str | None = None     # the lexicon phrase that decided it, if any

    @property
    def value(self) -> float:
        """The signal: the kind's value (VALUES) x confidence, on [-1, 1]."""
        return VALUES[self.kind] * self.confidence


NONE = Hindsight("none", 0.0)


def _first_words(text: str, n: int) -> str:
    return " ".join(words(text)[:n])


def _best(*found: tuple[str | None, float]) -> tuple[str | None, float]:
    return max(found, key=lambda x: x[1], default=(None, 0.0))


def _complaint(text: str, head: str) -> tuple[str | None, float]:
    """The strongest complaint cue of normalized `text` (`head`: its words, space-joined; the weak
    cues count only as its first word(s))."""
    found = [(m.group(1), _COMPLAINT_N[m.group(1)]) for m in _COMPLAINT_RE.finditer(text)]
    found += [(m.group(1), _COMPLAINT_START_N[m.group(1)]) for m in _COMPLAINT_START_RE.finditer(head)]
    found += [(p, c) for p, c in _COMPLAINT_SUBSTR.items() if p in text]
    return _best(*found)


def _thanks(text: str, head4: str) -> tuple[str | None, float]:
    """The strongest thanks / approval cue of normalized `text` (`head4`: its first four words)."""
    at_start = {m.group(1) for m in _THANKS_RE.finditer(head4)}
    found = [(p, _THANKS_N[p][1] if p in at_start else _THANKS_N[p][0])
             for p in {m.group(1) for m in _THANKS_RE.finditer(text)} | at_start]
    for p, (anywhere, start) in _THANKS_SUBSTR.items():
        i = text.find(p)
        if i >= 0:
            found.append((p, start if not words(text[:i]) else anywhere))
    return _best(*[f for f in found if f[1] > 0])


def classify(next_message: str | None, previous_message: str | None = None,
             reply: str | None = None) -> Hindsight:
    """The hindsight signal of `next_message` (the user's next message in the trace) about `reply`,
    the answer to `previous_message`. Total: any text (or None) gives a Hindsight; deterministic."""
    if not isinstance(next_message, str):
        return NONE
    text = _norm(next_message)
    c_phrase, c_conf = _complaint(text, _first_words(text, 3))
    t_phrase, t_conf = _thanks(text, _first_words(text, 4))
    if not words(text) and not c_conf and not t_conf:
        return NONE
    sim = similarity(previous_message if isinstance(previous_message, str) else None, next_message)
    if c_conf > 0 and c_conf >= t_conf - 0.15:   # a correction outweighs a polite "thanks, but"
        return Hindsight("complaint", _unit(c_conf + (0.05 if sim >= REASK_MIN else 0.0)), sim, c_phrase)
    if t_conf > 0:
        return Hindsight("thanks", _unit(t_conf), sim, t_phrase)
    if sim >= REASK_MIN:
        return Hindsight("reask", _unit(sim), sim)
    if isinstance(reply, str) and reply and similarity(reply, next_message) >= REASK_MIN:
        # builds on the answer ("what about the second step?"): moving on, engaged
        return Hindsight("new_topic", _unit(0.5 * (1.0 - sim / REASK_MIN)), sim, "<builds on reply>")
    return Hindsight("new_topic", _unit(1.0 - sim / REASK_MIN), sim)


def _unit(x: float) -> float:
    return 0.0 if not math.isfinite(x) else round(min(1.0, max(0.0, float(x))), 4)


def _last_user(messages: Sequence[Mapping[str, Any]]) -> str | None:
    for m in reversed(messages):
        if isinstance(m, Mapping) and m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else None
    return None


def trace_hindsight(turns: Sequence[tuple[Sequence[Mapping[str, Any]], str]]) -> list[Hindsight | None]:
    """Per turn of one trace, in turn order (each turn: its request messages, its reply text): the
    hindsight of the turn after it. The next request repeating this turn's request (a regenerate)
    is `reask` with confidence 1 and cue `<same request>`; a next request that does not continue
    after this reply (another branch) is `none`; the last turn gets None (no next message yet)."""
    out: list[Hindsight | None] = []
    for i, (request, reply) in enumerate(turns):
        if i + 1 >= len(turns):
            out.append(None)
            continue
        nxt = list(turns[i + 1][0])
        req = list(request)
        if nxt == req:
            out.append(Hindsight("reask", 1.0, 1.0, "<same request>"))
        elif (len(nxt) > len(req) and nxt[:len(req)] == req and isinstance(nxt[len(req)], Mapping)
              and nxt[len(req)].get("role") == "assistant" and nxt[len(req)].get("content") == reply):
            out.append(classify(_last_user(nxt[len(req) + 1:]), _last_user(req), reply))
        else:
            out.append(NONE)
    return out


def next_turn_hindsight(turns: Iterable[Mapping[str, Any]]) -> dict[tuple, Hindsight]:
    """The reward stage's pairing: per model turn (a mapping with tenant, trace_id, turn_id, turn_index,
    turn_time, user_text: the last user message of its request, out_text: its reply), the hindsight
    of the next turn of its trace, keyed (tenant, trace_id, turn_id). The next turn is the one with
    the least turn_index above this one's (ties: earliest turn_time, then turn_id); a turn without
    one (yet), or without a turn_index, gets no entry. Deterministic, whatever the input order."""
    traces: dict[tuple, list[Mapping[str, Any]]] = {}
    for t in turns:
        if t.get("turn_index") is not None and t.get("turn_id") is not None:
            traces.setdefault((t["tenant"], t["trace_id"]), []).append(t)
    out: dict[tuple, Hindsight] = {}
    for (tenant, trace), ts in traces.items():
        ts.sort(key=lambda t: (t["turn_index"], t["turn_time"], t["turn_id"]))
        j = 0
        for t in ts:
            while j < len(ts) and ts[j]["turn_index"] <= t["turn_index"]:
                j += 1
            if j < len(ts):
                nxt = ts[j]
                out[(tenant, trace, t["turn_id"])] = classify(nxt.get("user_text"), t.get("user_text"),
                                                              t.get("out_text"))
    return out


@dataclass(frozen=True)
class Agreement:
    """One hindsight kind against explicit votes on the same turns."""

    kind: str
    count: int                 # turns with this kind (confidence >= the threshold) and a vote
    agree: int                 # ... whose vote has the sign of the kind's value
    accuracy: float            # agree / count (nan when count is 0)
    accuracy_low: float        # Wilson 95% lower bound of the accuracy (0 when count is 0)
    mean_confidence: float
    mean_vote: float           # mean sign of the votes on these turns, on [-1, 1] (nan when count is 0)
    lift: float                # mean_vote - the mean over every voted turn: what the kind tells beyond
                               # the base rate (sign accuracy of a weak positive is swamped by a low base rate)
    weight: float              # suggested spec weight: thumbs_weight x max(0, 2 x accuracy_low - 1)


def _wilson_low(k: int, n: int, z: float = 1.96) -> float:
    if n == 0:
        return 0.0
    p = k / n
    d = 1 + z * z / n
    return max(0.0, (p + z * z / (2 * n) - z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / d)


def _vote(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v == 0:
        return None
    return 1.0 if v > 0 else -1.0


def calibrate(signals: Mapping[Hashable, Hindsight | None] | Iterable[tuple[Hashable, Hindsight | None]],
              votes: Mapping[Hashable, float], min_confidence: float = 0.0,
              thumbs_weight: float = 1.0) -> dict[str, Agreement]:
    """Agreement of each hindsight kind with the explicit votes (thumbs +1 / -1, or any signed number:
    0, NaN or a non-number is no vote) on the same turns (keys). A kind agrees with a vote when the
    signs of its value and of the vote match. The suggested weight is 0 for a kind no better than
    chance at 95% confidence and tends to `thumbs_weight` for one that always agrees. Keyed by kind
    (every kind but `none`, present even with no turns), plus `all`."""
    items = list(signals.items() if isinstance(signals, Mapping) else signals)
    voted = [x for x in (_vote(v) for v in votes.values()) if x is not None]
    base = sum(voted) / len(voted) if voted else math.nan
    acc: dict[str, list[tuple[bool, float, float]]] = {k: [] for k in KINDS if VALUES[k] != 0}
    for key, h in items:
        if h is None or VALUES.get(h.kind, 0.0) == 0.0 or h.confidence < min_confidence:
            continue
        v = _vote(votes.get(key))
        if v is None:
            continue
        acc[h.kind].append(((v > 0) == (VALUES[h.kind] > 0), h.confidence, v))
    acc["all"] = [x for k in list(acc) for x in acc[k]]
    out = {}
    for kind, xs in acc.items():
        n, k = len(xs), sum(a for a, _, _ in xs)
        low = _wilson_low(k, n)
        mean_vote = sum(v for _, _, v in xs) / n if n else math.nan
        out[kind] = Agreement(kind, n, k, k / n if n else math.nan, low,
                              sum(c for _, c, _ in xs) / n if n else math.nan, mean_vote, mean_vote - base,
                              round(thumbs_weight * max(0.0, 2 * low - 1), 3))
    return out


def format_calibration(result: Mapping[str, Agreement]) -> str:
    rows = [f"{'kind':<10} {'count':>6} {'agree':>6} {'accuracy':>8} {'low95':>6} {'conf':>5} {'vote':>6} "
            f"{'lift':>6} {'weight':>6}"]
    for a in result.values():
        rows.append(f"{a.kind:<10} {a.count:>6} {a.agree:>6} {a.accuracy:>8.3f} {a.accuracy_low:>6.3f} "
                    f"{a.mean_confidence:>5.2f} {a.mean_vote:>+6.3f} {a.lift:>+6.3f} {a.weight:>6.3f}")
    return "\n".join(rows)


def log_calibration(result: Mapping[str, Agreement], logger: logging.Logger | None = None) -> str:
    """Log the agreement table (INFO, `tracerl.reward.hindsight`); returns it."""
    text = format_calibration(result)
    (logger or logging.getLogger("tracerl.reward.hindsight")).info("hindsight vs explicit votes:\n%s", text)
    return text
