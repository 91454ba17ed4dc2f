"""The worker-process decode path gives exactly what the inline path gives."""

import json
from datetime import datetime, timezone

from pipelines.ingest.decode import Chunk, Decoder
from pipelines.ingest.sample import bad_messages, generate


VALUES = [json.dumps(e.to_dict()).encode()
          for e in generate(30, seed=3, start=datetime(2026, 11, 30, tzinfo=timezone.utc))]
VALUES[5:5] = [raw for _, raw in bad_messages(4096)]


def _chunks():
    values = VALUES
    half = len(values) // 2
    for first, part in ((0, values[:half]), (half, values[half:])):
        yield Chunk("t", first % 2, first, list(range(first, first + len(part))), [1_700_000_000_000] * len(part),
                    [b"k"] * len(part), part)


def _decode(workers: int, parallel_from: int):
    d = Decoder(4096, workers, "run-1", 1_700_000_000_000, parallel_from=parallel_from)
    try:
        for chunk in _chunks():
            d.submit(chunk)
        return d.results()
    finally:
        d.close()


def test_worker_process_and_inline_decode_agree():
    inline_events, inline_bad = _decode(workers=0, parallel_from=1)
    worker_events, worker_bad = _decode(workers=1, parallel_from=1)
    assert inline_events.num_rows > 100 and inline_bad.num_rows == len(bad_messages(4096))
    assert worker_events.schema == inline_events.schema and worker_bad.schema == inline_bad.schema
    assert worker_events.to_pylist() == inline_events.to_pylist()
    assert worker_bad.to_pylist() == inline_bad.to_pylist()
    assert inline_events.column("row").to_pylist() == sorted(inline_events.column("row").to_pylist())
