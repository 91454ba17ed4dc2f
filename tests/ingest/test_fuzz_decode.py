"""Fuzz target for decode: byte-level mutations of valid and hostile messages, for a bounded time.

Each round is a fresh hypothesis search (new random seed) over messages built by splicing
hostile tokens (NaN, surrogate escapes, CESU-8, BOMs, brackets, huge literals) into, and
flipping, cutting and repeating bytes of, valid events and the hostile corpus. The properties:
`decode_message` raises nothing but a `ValidationError` that blames the input (never
`internal_error`); and every message it accepted, decoded as one chunk, lands and reads back
through every lake view, strictly.

`make test` runs it for TRACERL_FUZZ_SECONDS (default 60). Longer, by hand:

    TRACERL_FUZZ_SECONDS=3600 .venv/bin/python -m pytest -q tests/ingest/test_fuzz_decode.py -s
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.contract.validate import INTERNAL_ERROR, ValidationError, decode_message
from pipelines.ingest.decode import Chunk, decode_chunk
from pipelines.ingest.sample import generate
from tests.ingest.hostile import corpus, land_tables, query_views

SECONDS = float(os.environ.get("TRACERL_FUZZ_SECONDS", "60"))
MAX = 64 * 1024
SEEDS = [json.dumps(e.to_dict()).encode() for e in generate(16, seed=9)] + [
    c.raw for c in corpus(4096) if c.raw is not None and len(c.raw) <= 4096]
TOKENS = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"9" * 400, b"\\ud800", b"\\udc00", b"\\ud83d\\ude00",
          b"\xed\xa0\x80", b"\xef\xbb\xbf", b"\xff", b"\x00", b"[" * 40, b"{\"a\":" * 40, b"]", b"}", b"\"",
          b",", b":", b"null", b"true", b"-0", b"2147483648", b"9223372036854775808", b"\"schema_version\": [1]",
          b"\"event_time\": \"0001-01-01T00:00:00+01:00\"", b"\"tenant\": \"x\", \"tenant\": \"y\"", b"\\u0000"]

edit = st.tuples(st.sampled_from(["insert", "replace", "flip", "cut", "repeat"]), st.floats(0, 1, exclude_max=True),
                 st.sampled_from(TOKENS) | st.binary(min_size=1, max_size=8), st.integers(1, 64))


def apply(seed: bytes, edits: list) -> bytes:
    b = bytearray(seed)
    for how, where, token, n in edits:
        i = int(where * (len(b) + 1))
        if how == "insert":
            b[i:i] = token
        elif how == "replace":
            b[i:i + len(token)] = token
        elif how == "flip" and i < len(b):
            b[i] ^= 1 << (n % 8)
        elif how == "cut":
            del b[i:i + n]
        elif how == "repeat":
            b[i:i] = b[i:i + n] * 2
    return bytes(b)


def test_fuzz_decode_for_a_bounded_time():
    accepted: list[bytes] = []
    rounds = tried = 0

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.sampled_from(SEEDS), st.lists(edit, min_size=1, max_size=6))
    def one(seed, edits):
        nonlocal tried
        tried += 1
        value = apply(seed, edits)
        try:
            decode_message(value, MAX)
        except ValidationError as err:
            assert err.reason != INTERNAL_ERROR, (value[:200], err)
            return
        if len(accepted) < 20_000:
            accepted.append(value)

    deadline = time.monotonic() + SECONDS
    while rounds == 0 or time.monotonic() < deadline:
        one()
        rounds += 1
    values = accepted or SEEDS[:1]
    n = len(values)
    events, bad = decode_chunk(Chunk("fuzz", 0, 0, list(range(n)), [1_700_000_000_000] * n, [None] * n, values),
                               MAX, "fuzz", 1_700_000_000_000)
    assert (events.num_rows, bad.num_rows) == (n, 0)  # what decode_message accepts, the chunk lands
    with tempfile.TemporaryDirectory() as root:
        land_tables(Path(root), events, bad)
        assert query_views(Path(root))["events"] == n
    print(f"fuzz: {tried} messages in {rounds} rounds, {len(accepted)} accepted and landed")
