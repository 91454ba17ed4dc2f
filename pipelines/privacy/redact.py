"""PII out of the recorded text: e-mail addresses, phone numbers, payment card numbers and IBANs
become typed placeholders (``[EMAIL]``, ``[PHONE]``, ``[CARD]``, ``[IBAN]``) in what the gateway
records (the input messages, the output text, feedback text, tool-call arguments and errors),
never in what the user is answered. Per tenant: ``[privacy] redact_pii`` (docs/privacy.md).

Regular expressions with checks, not a library: Microsoft Presidio, the well-kept one, finds
these with regexes and checksums too, and needs spaCy and a language model for names, which is
neither cheap on the gateway's CPU nor installable from a package registry alone; for the four
kinds here a regex plus the number's own checksum is what it would do. Names are not redacted
(docs/privacy.md says why).

- e-mail: RFC 5322's dot-atom local part (the printable characters it allows) ``@`` a domain of
  LDH labels with a top-level label of two or more characters.
- IBAN: a country code of the registry (``IBAN_LENGTHS``), two check digits, the country's length
  in letters and digits, written whole or in groups with single spaces; the ISO 7064 mod-97
  check must give 1.
- card: 14 to 19 digits, whole or in the printed groups (4-4-4-4[-1..3], 4-6-4, 4-6-5; spaces or
  dashes) that pass the Luhn check. A group that follows a card is not part of it.
- phone: international (``+``, a country code, 8 to 15 digits in all, single spaces, dots, dashes
  or a parenthesised group between), North American ``(555) 123-4567`` / ``555-123-4567`` /
  ``555.123.4567``, and national numbers starting with 0 (9 to 12 digits, one kind of
  separator, e.g. ``030 1234 5678``, ``06.12.34.56.78``, ``0171-1234567``). Bare runs of digits
  without a ``+`` or separators are left alone: they are order numbers and timestamps as often
  as phones. Dates and IPv4 addresses are never taken for phones.

What it leaves alone: version numbers, dates, times, amounts, short numbers, digit runs that fail
the checksums. It is idempotent (a placeholder never matches, and a text is redacted until
nothing more matches) and never makes a text longer by more than one character per e-mail
address (``[EMAIL]`` is 7 characters; the shortest address, ``a@b.cd``, is 6).
"""

from __future__ import annotations

import re
from typing import Any, Callable

EMAIL, PHONE, CARD, IBAN = "[EMAIL]", "[PHONE]", "[CARD]", "[IBAN]"
KINDS = ("email", "iban", "card", "phone")  # the order they are looked for in

# ISO 13616 registry: country -> IBAN length (SWIFT's IBAN registry).
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BI": 27,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HN": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21,
    "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28,
    "NL": 18, "NO": 15, "OM": 23, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22,
    "RU": 33, "SA": 24, "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25,
    "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}

_ATEXT = r"A-Za-z0-9!#$%&'*+/=?^_`{|}~-"
# A match starts only where a run of local-part characters starts (the lookbehind), and the
# possessive quantifiers never backtrack: linear in the text, even in 256 KB without an '@'.
_EMAIL = re.compile(rf"(?<![{_ATEXT}])[{_ATEXT}]++(?:\.[{_ATEXT}]++)*+@"
                    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z][A-Za-z0-9-]{0,61}[A-Za-z0-9]"
                    r"(?![A-Za-z0-9-]|\.[A-Za-z0-9])")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}")
# Every place a card could start (a zero-width lookahead: candidates overlap, so a number written
# just before a card cannot hide it), with the longest card-shaped text from there.
_CARD_AT = re.compile(r"(?<![0-9A-Za-z])(?=([0-9]{4}([ -])[0-9]{4}\2[0-9]{4}\2[0-9]{1,4}(?:\2[0-9]{1,3})?(?![0-9])"
                      r"|[0-9]{4}([ -])[0-9]{6}\3[0-9]{4,5}(?![0-9])|[0-9]{14,19}(?![0-9])))")
_PHONE = re.compile(
    r"(?<![\w+.])(?:"
    r"\+[0-9]{1,3}(?:[ .-]?(?:\([0-9]{1,4}\)|[0-9]+))+"          # international: +49 (0)30 1234-5678
    r"|(?:\([0-9]{3}\) ?|[0-9]{3}([ .-]))[0-9]{3}(?(1)\1|[ .-])[0-9]{4}"  # North American
    r"|0[0-9]{1,4}([ ./-]?)[0-9]{2,8}(?:\2[0-9]{2,8}){0,4}"      # national, from 0, one kind of separator
    r")(?![0-9]|[.,-][0-9]|\w)")
_DATE = re.compile(r"(?:^|[^0-9])(?:[0-9]{1,2}[./-][0-9]{1,2}[./-][0-9]{4}|[0-9]{4}[./-][0-9]{1,2}[./-][0-9]{1,2})"
                   r"(?![0-9])")
_IPV4 = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")


def luhn(digits: str) -> bool:
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = ord(c) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_ok(compact: str) -> bool:
    """ISO 7064 mod 97-10 over a compact, upper-case IBAN of its country's length."""
    if IBAN_LENGTHS.get(compact[:2]) != len(compact) or not compact[2:4].isdigit():
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _iban(m: re.Match) -> str:
    text = m.group()
    length = IBAN_LENGTHS.get(text[:2])
    if length is None:
        return text
    taken, end = 0, 0
    for end, c in enumerate(text, 1):  # the country's length of letters and digits: the rest is not it
        taken += c != " "
        if taken == length:
            break
    if taken < length or not iban_ok(text[:end].replace(" ", "")):
        return text
    return IBAN + text[end:]


def _cards(text: str) -> str:
    out, done = [], 0
    for m in _CARD_AT.finditer(text):
        start = m.start()
        if start < done:
            continue  # inside a card already taken
        candidate = m.group(1)
        groups = re.split(r"[ -]", candidate)
        for k in range(len(groups), 0, -1):  # a group that follows a card number is not part of it
            digits = "".join(groups[:k])
            if 14 <= len(digits) <= 19 and luhn(digits):
                out += [text[done:start], CARD]
                done = start + sum(len(g) + 1 for g in groups[:k]) - 1
                break
    return "".join(out) + text[done:] if out else text


def _phone(m: re.Match) -> str:
    text = m.group()
    digits = sum(c.isdigit() for c in text)
    if text.startswith("+"):
        ok = 8 <= digits <= 15
    elif text.startswith("0"):
        ok = 9 <= digits <= 12
    else:
        ok = digits == 10
    if not ok or _DATE.search(text) or _IPV4.fullmatch(text):
        return text
    return PHONE


_RULES: list[tuple[str, str, str, Callable[[str], str]]] = [
    ("email", EMAIL, "@", lambda t: _EMAIL.sub(EMAIL, t)), ("iban", IBAN, "", lambda t: _IBAN.sub(_iban, t)),
    ("card", CARD, "", _cards), ("phone", PHONE, "", lambda t: _PHONE.sub(_phone, t))]
_EIGHT_DIGITS = re.compile(r"(?:[0-9][^0-9]*+){8}")  # what a card or phone needs at least
_IBAN_START = re.compile(r"[A-Z]{2}[0-9]{2}")  # an IBAN can be mostly letters


def redact_text(text: str, counts: dict[str, int] | None = None) -> str:
    """``text`` with every e-mail address, IBAN, card and phone number replaced by its placeholder;
    ``counts`` (kind -> placeholders put in) is added to. Repeated until nothing more matches
    (removing one can make another: idempotent), which ends: each pass that changes the text
    removes digits or an '@', and placeholders hold neither."""
    if not text or ("@" not in text and _EIGHT_DIGITS.search(text) is None and _IBAN_START.search(text) is None):
        return text
    while True:
        before = text
        for kind, placeholder, needle, redact in _RULES:
            if needle and needle not in text:
                continue
            new = redact(text)
            if counts is not None and new != text:
                counts[kind] = counts.get(kind, 0) + new.count(placeholder) - text.count(placeholder)
            text = new
        if text == before:
            return text


def _value(v: Any, counts: dict[str, int]) -> Any:
    """Strings anywhere in a JSON value redacted (object keys kept)."""
    if type(v) is str:
        return redact_text(v, counts)
    if type(v) is dict:
        return {k: _value(x, counts) for k, x in v.items()}
    if type(v) is list:
        return [_value(x, counts) for x in v]
    return v


def redact_event(event: dict[str, Any]) -> dict[str, int]:
    """Redact an event dict (wire form) in place; the counts per kind (empty: nothing found).

    A turn whose output text changed loses its output token ids and logprobs, and one whose
    input changed its prompt token ids: the ids would spell the text out again. The learner then
    re-tokenizes the redacted text (and trains that turn without an importance ratio)."""
    counts: dict[str, int] = {}
    kind = event.get("type")
    if kind == "model_turn":
        changed_in = False
        for m in event.get("input_messages") or ():
            content = m.get("content")
            if type(content) is str:
                new = redact_text(content, counts)
                if new != content:
                    m["content"], changed_in = new, True
        if changed_in:
            event.pop("prompt_token_ids", None)
        out = event.get("output_text")
        if type(out) is str:
            new = redact_text(out, counts)
            if new != out:
                event["output_text"] = new
                event.pop("output_token_ids", None)
                event.pop("output_logprobs", None)
    elif kind == "feedback":
        if type(event.get("text")) is str:
            event["text"] = redact_text(event["text"], counts)
    elif kind == "tool_call":
        if event.get("arguments") is not None:
            event["arguments"] = _value(event["arguments"], counts)
        if type(event.get("error")) is str:
            event["error"] = redact_text(event["error"], counts)
    return counts
