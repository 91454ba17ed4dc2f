"""PII redaction (pipelines/privacy/redact.py), by property: every generated e-mail address, card
and IBAN is gone, ordinary text (versions, dates, times, amounts, short numbers) is untouched,
redacting twice is redacting once, and a text never grows by more than one character per '@'.
Plus the phone formats it promises, what it leaves alone, and its speed on hostile text."""

from __future__ import annotations

import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipelines.privacy.redact import (CARD, EMAIL, IBAN, IBAN_LENGTHS, PHONE, iban_ok, luhn, redact_event,
                                      redact_text)

WORDS = ["the", "order", "shipped", "on", "version", "call", "me", "at", "invoice", "total", "is", "build",
         "Paris", "ETA", "room", "page", "see", "step", "and", "or", "v", "no.", "ID", "ref", "x", "DE", "GB"]


def _luhn_digit(body: str) -> str:
    return next(d for d in "0123456789" if luhn(body + d))


@st.composite
def cards(draw) -> str:
    prefix = draw(st.sampled_from(["4", "51", "55", "2221", "34", "37", "6011", "65", "35", "36", "62"]))
    length = 15 if prefix in ("34", "37") else draw(st.integers(14, 19))
    body = prefix + "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=length - len(prefix) - 1,
                                          max_size=length - len(prefix) - 1)))
    number = body + _luhn_digit(body)
    style = draw(st.sampled_from(["plain", "space", "dash", "amex"] if length == 15 else ["plain", "space", "dash"]))
    if style == "plain":
        return number
    if style == "amex":
        return f"{number[:4]} {number[4:10]} {number[10:]}"
    sep = " " if style == "space" else "-"
    return sep.join(number[i:i + 4] for i in range(0, len(number), 4))


@st.composite
def ibans(draw) -> str:
    country = draw(st.sampled_from(sorted(IBAN_LENGTHS)))
    bban = "".join(draw(st.lists(st.sampled_from("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
                                 min_size=IBAN_LENGTHS[country] - 4, max_size=IBAN_LENGTHS[country] - 4)))
    check = 98 - int("".join(str(int(c, 36)) for c in bban + country + "00")) % 97
    compact = f"{country}{check:02d}{bban}"
    assert iban_ok(compact)
    return compact if draw(st.booleans()) else " ".join(compact[i:i + 4] for i in range(0, len(compact), 4))


versions = st.builds(lambda a, b, c: f"{a}.{b}.{c}", st.integers(0, 30), st.integers(0, 99), st.integers(0, 999)) | \
    st.builds(lambda a, b: f"v{a}.{b}", st.integers(0, 30), st.integers(0, 99))
dates = st.dates().filter(lambda d: d.year >= 1900).flatmap(lambda d: st.sampled_from(
    [d.isoformat(), d.strftime("%d.%m.%Y"), d.strftime("%m/%d/%Y"), d.strftime("%d/%m/%Y"), d.strftime("%Y/%m/%d")]))
times = st.builds(lambda h, m, s: f"{h:02d}:{m:02d}" + (f":{s:02d}" if s % 2 else ""),
                  st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
amounts = st.builds(lambda n, c: f"{n:,}.{c:02d}", st.integers(0, 9_999_999), st.integers(0, 99)) | \
    st.builds(lambda n: f"${n}", st.integers(0, 99_999)) | st.builds(lambda n: f"{n}%", st.integers(0, 100))
short_numbers = st.integers(0, 999_999).map(str) | st.integers(0, 99_999).map(lambda n: f"#{n}")
ordinary_items = versions | dates | times | amounts | short_numbers


@st.composite
def ordinary_text(draw) -> str:
    """Words with numbers of everyday kinds between them (a word between two numbers: three short
    numbers in a row can be a phone number, and are written so)."""
    parts = []
    for _ in range(draw(st.integers(1, 12))):
        parts.append(draw(st.sampled_from(WORDS)))
        if draw(st.booleans()):
            parts.append(draw(ordinary_items) + draw(st.sampled_from(["", ",", ".", ";", ")"])))
    return " ".join(parts)


def around(pii: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[str, str]]:
    return st.tuples(ordinary_text(), pii, st.sampled_from(["", ".", ",", ")", ";"]), ordinary_text()).map(
        lambda t: (f"{t[0]} {t[1]}{t[2]} {t[3]}", t[1]))


@settings(max_examples=300, deadline=None)
@given(ordinary_text())
@example("version 1.2.3 on 2024-01-15 at 12:30, total 1,234.56 and 45%")
@example("see 05.01.2024 10:30 and 192.168.1.1 or build 20240115")
def test_ordinary_text_is_left_alone(text):
    assert redact_text(text) == text


@settings(max_examples=300, deadline=None)
@given(around(st.emails()))
def test_every_email_address_is_removed(case):
    text, email = case
    out = redact_text(text)
    assert email not in out and EMAIL in out


@settings(max_examples=300, deadline=None)
@given(around(cards()))
def test_every_card_number_is_removed(case):
    text, card = case
    out = redact_text(text)
    assert card not in out and CARD in out
    digits = "".join(c for c in card if c.isdigit())
    assert digits not in "".join(c for c in out if c.isdigit())


@settings(max_examples=300, deadline=None)
@given(around(ibans()))
def test_every_iban_is_removed(case):
    text, iban = case
    out = redact_text(text)
    assert iban not in out and IBAN in out and iban.replace(" ", "") not in out.replace(" ", "")


NOISY = st.text(alphabet=st.sampled_from("0123456789 -.+()/@abXY_:,"), max_size=120)
mixed = st.lists(NOISY | ordinary_text() | st.emails() | cards() | ibans() | st.text(max_size=30), max_size=8).map(" ".join)


@settings(max_examples=500, deadline=None)
@given(mixed)
def test_redacting_twice_is_redacting_once_and_text_grows_at_most_a_character_per_at_sign(text):
    once = redact_text(text)
    assert redact_text(once) == once
    assert len(once) <= len(text) + text.count("@")


@pytest.mark.parametrize("text", [
    "+49 30 1234567", "+1 (555) 123-4567", "+33 6 12 34 56 78", "+44 20 7946 0958", "+4915112345678",
    "(555) 123-4567", "555-123-4567", "555.123.4567", "030 1234 5678", "06.12.34.56.78", "0171-1234567",
    "020 7946 0958"])
def test_phone_numbers_in_the_promised_formats_are_removed(text):
    assert redact_text(f"call {text} today") == f"call {PHONE} today"


@pytest.mark.parametrize("text", [
    "order 12345678 12345678", "timestamp 1733500000000", "10 20 30 40 50 60 70", "ip 192.168.100.200",
    "4111 1111 1111 1112", "DE89 3704 0044 0532 0130 02", "5551234567", "05.01.2024 10:30", "1.5e10",
    "user@localhost", "@mention", "ab@cd", "+12", "0.0.0.0:8080", "2024-01-15T10:30:00Z"])
def test_numbers_that_fail_the_checks_and_things_that_only_look_alike_are_left(text):
    assert redact_text(text) == text


@pytest.mark.parametrize("text", ["a" * 262_144, "1" * 262_144, "a@" * 131_072, "1 " * 131_072, "+1" * 131_072,
                                  "a." * 131_072, "DE89" * 65_536, "0" + "1-" * 131_071, "a@b." * 65_536])
def test_hostile_text_of_the_largest_size_a_message_takes_is_redacted_in_linear_time(text):
    t0 = time.perf_counter()
    once = redact_text(text)
    assert time.perf_counter() - t0 < 2.0 and redact_text(once) == once


def test_an_event_loses_the_token_ids_that_would_spell_the_text_out_again():
    turn = {"type": "model_turn", "input_messages": [{"role": "system", "content": "be brief"},
                                                      {"role": "user", "content": "mail bob@example.com"}],
            "output_text": "ok, 4111 1111 1111 1111", "output_token_ids": [1, 2], "output_logprobs": [-0.1, -0.2],
            "prompt_token_ids": [5, 6]}
    assert redact_event(turn) == {"email": 1, "card": 1}
    assert turn["input_messages"][1]["content"] == f"mail {EMAIL}" and turn["output_text"] == f"ok, {CARD}"
    assert not {"output_token_ids", "output_logprobs", "prompt_token_ids"} & set(turn)
    clean = {"type": "model_turn", "input_messages": [{"role": "user", "content": "hi"}], "output_text": "hello",
             "output_token_ids": [1], "output_logprobs": [-0.1], "prompt_token_ids": [5]}
    assert redact_event(dict(clean)) == {} and redact_event(clean) == {} and clean["prompt_token_ids"] == [5]
    call = {"type": "tool_call", "arguments": {"to": ["a@b.cd", {"iban": "GB82 WEST 1234 5698 7654 32"}], "n": 3},
            "error": "no route to +44 20 7946 0958"}
    assert redact_event(call) == {"email": 1, "iban": 1, "phone": 1}
    assert call["arguments"] == {"to": [EMAIL, {"iban": IBAN}], "n": 3} and call["error"] == f"no route to {PHONE}"
    fb = {"type": "feedback", "text": "write to a@b.cd"}
    assert redact_event(fb) == {"email": 1} and fb["text"] == f"write to {EMAIL}"
