"""A small English corpus generated in code, for the tiny test model's tokenizer and warm-up.

Why generate text instead of shipping a file: the tiny model must build offline (no hub, no
downloads) and byte-for-byte the same everywhere, so the corpus is a pure function of a fixed
seed. It covers what tracerl's traffic looks like: plain sentences, questions and short answers,
digits, prices, dates, punctuation, JSON tool calls and tool results, a little code, and chat
turns in ChatML form (so a warmed-up model learns to close a reply with ``<|im_end|>``).
"""

from __future__ import annotations

import json
import random

SUBJECTS = [
    "The cat", "A small dog", "My neighbour", "The teacher", "Our team", "The old man",
    "A young girl", "The engineer", "The server", "This model", "The manager", "Your friend",
    "The pilot", "A student", "The doctor", "The farmer", "Everyone", "Nobody", "The baker",
]
VERBS = [
    "reads", "writes", "finds", "likes", "sends", "opens", "closes", "checks", "fixes",
    "builds", "moves", "cleans", "paints", "carries", "counts", "watches", "answers", "sells",
]
OBJECTS = [
    "the book", "a letter", "the door", "the report", "a new car", "the garden", "the code",
    "the window", "an email", "the bill", "a red apple", "the map", "the bread", "the table",
    "the logs", "a question", "the order", "the file", "the test",
]
PLACES = [
    "in the morning", "at the office", "after lunch", "near the river", "on Monday",
    "before dinner", "at home", "in the park", "every day", "late at night", "in London",
    "in Paris", "on the train", "at school", "today", "yesterday", "tomorrow",
]
CITIES = ["Paris", "London", "Berlin", "Tokyo", "Madrid", "Rome", "Oslo", "Cairo", "Lima", "Seoul"]
TOOLS = {
    "get_weather": lambda r: {"city": r.choice(CITIES), "unit": r.choice(["celsius", "fahrenheit"])},
    "search_docs": lambda r: {"query": r.choice(OBJECTS).split()[-1], "limit": r.randint(1, 20)},
    "create_ticket": lambda r: {"title": f"Fix {r.choice(OBJECTS).split()[-1]}", "priority": r.randint(1, 5)},
    "convert_currency": lambda r: {"amount": round(r.uniform(1, 500), 2), "from": "USD", "to": "EUR"},
    "read_file": lambda r: {"path": f"src/{r.choice(['main', 'utils', 'api'])}.py", "line": r.randint(1, 300)},
}
GREETINGS = ["Hello!", "Hi there.", "Good morning.", "Hey, can you help me?", "Thanks a lot!"]
REPLIES = [
    "Sure, I can help with that.", "Of course.", "Here is what I found.", "Yes, that is right.",
    "No, that is not correct.", "I am not sure, but I will check.", "Done.", "You're welcome!",
]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]


def _sentence(r: random.Random) -> str:
    s = f"{r.choice(SUBJECTS)} {r.choice(VERBS)} {r.choice(OBJECTS)} {r.choice(PLACES)}"
    return s + r.choice([".", ".", ".", "!", "; then it rains.", ", and that's fine."])


def _arithmetic(r: random.Random) -> tuple[str, str]:
    a, b = r.randint(0, 999), r.randint(0, 99)
    op, val = r.choice([("plus", a + b), ("minus", a - b), ("times", a * b)])
    return f"What is {a} {op} {b}?", f"{a} {op} {b} is {val}."


def _fact(r: random.Random) -> str:
    kind = r.randrange(5)
    if kind == 0:
        return f"The price is ${r.randint(1, 999)}.{r.randint(0, 99):02d} (tax included)."
    if kind == 1:
        return f"It happened on {r.choice(MONTHS)} {r.randint(1, 28)}, {r.randint(1950, 2030)}."
    if kind == 2:
        return f"About {r.randint(1, 99)}% of users said \"yes\"; {r.randint(1, 9)} said \"no\"."
    if kind == 3:
        return f"Call me at {r.randint(100, 999)}-{r.randint(1000, 9999)} before {r.randint(1, 12)}:{r.choice(['00', '15', '30', '45'])} pm."
    return f"Step {r.randint(1, 9)}: {r.choice(VERBS)} {r.choice(OBJECTS)}, then wait {r.randint(2, 60)} seconds."


def _tool_call(r: random.Random) -> tuple[str, str]:
    name = r.choice(sorted(TOOLS))
    call = json.dumps({"name": name, "arguments": TOOLS[name](r)})
    result = json.dumps({"ok": r.random() > 0.2, "result": _sentence(r), "ms": r.randint(3, 900)})
    return call, result


def _code(r: random.Random) -> str:
    fn = r.choice(["add", "scale", "clip", "mean", "total"])
    return (f"def {fn}(x, y={r.randint(1, 9)}):\n    # {r.choice(VERBS)} the values\n"
            f"    return [v * y for v in x if v > {r.randint(0, 5)}]\n")


def _chat(r: random.Random) -> str:
    """One conversation in ChatML, the same layout as the tiny model's chat template."""
    turns = []
    if r.random() < 0.3:
        turns.append(("system", "You are a helpful assistant."))
    kind = r.randrange(4)
    if kind == 0:
        q, a = _arithmetic(r)
        turns += [("user", q), ("assistant", a)]
    elif kind == 1:
        call, result = _tool_call(r)
        turns += [("user", f"Can you use a tool? {_sentence(r)}"), ("assistant", call),
                  ("tool", result), ("assistant", r.choice(REPLIES))]
    elif kind == 2:
        turns += [("user", r.choice(GREETINGS)), ("assistant", r.choice(REPLIES) + " " + _sentence(r))]
    else:
        turns += [("user", f"Is it true that {_sentence(r)[0].lower()}{_sentence(r)[1:]}"),
                  ("assistant", r.choice(REPLIES) + " " + _fact(r))]
    return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)


def build_corpus(n_lines: int = 4000, seed: int = 1234) -> list[str]:
    """Return ``n_lines`` documents; the same list for the same arguments, on any machine.

    ``random.Random`` with an int seed is specified to be reproducible across platforms and
    Python versions, which is what makes the tokenizer (and so the model) deterministic.
    """
    r = random.Random(seed)
    makers = [
        lambda: _sentence(r),
        lambda: " ".join(_sentence(r) for _ in range(r.randint(2, 4))),
        lambda: " ".join(_arithmetic(r)),
        lambda: _fact(r),
        lambda: _tool_call(r)[0],
        lambda: _tool_call(r)[1],
        lambda: _code(r),
        lambda: _chat(r),
        lambda: _chat(r),
    ]
    return [r.choice(makers)() for _ in range(n_lines)]


def build_chat_corpus(n_lines: int = 2000, seed: int = 4321) -> list[str]:
    """Chat-only documents for the warm-up: the model learns the turn layout and to stop."""
    r = random.Random(seed)
    return [_chat(r) for _ in range(n_lines)]
