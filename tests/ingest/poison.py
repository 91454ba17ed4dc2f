"""A decoder bug only some messages hit, for the tests of the run-level isolation.

Decode is meant to be total; if it is not, a message must still never block the stream. To test
that, `poison_decoder` makes `decode_chunk` raise for any chunk holding a poisoned message."""

from __future__ import annotations

import json

from pipelines.ingest import decode as decode_module

POISON = b"POISON"


def poison_decoder(monkeypatch) -> None:
    real = decode_module.decode_chunk

    def decode_chunk(chunk, *args, **kwargs):
        if any(POISON in (v or b"") for v in chunk.values):
            raise RecursionError("maximum recursion depth exceeded (injected)")
        return real(chunk, *args, **kwargs)

    monkeypatch.setattr(decode_module, "decode_chunk", decode_chunk)  # inline and isolation paths


def poisoned(event) -> bytes:
    """`event`, valid, carrying the poison in a field the contract lets producers add."""
    return json.dumps(event.to_dict() | {"note": POISON.decode()}).encode()
