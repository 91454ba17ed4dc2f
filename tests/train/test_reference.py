"""Reference logprobs kept in the lake: computed once per turn, read instead of re-run, never read
across another base, precision or tokenization."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from pipelines.lake.reference import Reference, ReferenceKey, ids_digest, read_reference, record_reference  # noqa: E402
from pipelines.train.step import train_step  # noqa: E402
from tests.train.test_step import _cfg, _lora_state, _turns, tiny, tok  # noqa: E402,F401  (fixtures)


def test_kept_references_are_read_by_key_and_the_newest_wins(tmp_path):
    key, other_base, bf16 = ReferenceKey("b" * 64, "fp32"), ReferenceKey("c" * 64, "fp32"), ReferenceKey("b" * 64, "bf16")
    record_reference(tmp_path, "acme", "qa", key, {"t1": Reference("d1", [-0.5, -1.25]), "t2": Reference("d2", [-2.0])}, "v1")
    record_reference(tmp_path, "acme", "qa", other_base, {"t1": Reference("d1", [-9.0, -9.0])}, "v2")
    assert read_reference(tmp_path, "acme", "qa", key, ["t1", "t2", "t3"]) == {
        "t1": Reference("d1", [-0.5, -1.25]), "t2": Reference("d2", [-2.0])}
    assert read_reference(tmp_path, "acme", "qa", other_base, ["t1", "t2"]) == {"t1": Reference("d1", [-9.0, -9.0])}
    assert read_reference(tmp_path, "acme", "qa", bf16, ["t1"]) == {}          # another precision
    assert read_reference(tmp_path, "acme", "other", key, ["t1"]) == {}        # another task
    assert read_reference(tmp_path, "other", "qa", key, ["t1"]) == {}          # another tenant
    import time
    time.sleep(0.01)
    record_reference(tmp_path, "acme", "qa", key, {"t2": Reference("d3", [-3.0])}, "v3")
    assert read_reference(tmp_path, "acme", "qa", key, ["t2"]) == {"t2": Reference("d3", [-3.0])}


def test_a_kept_reference_replaces_the_reference_forward_with_the_same_update(tiny, tok, tmp_path):
    turns = _turns(tok)
    cfg = _cfg(steps=1)
    first = train_step(tiny, None, turns, cfg, tmp_path / "a", seed=0)
    assert first.steps[0]["reference_read"] == 0 and first.summary["reference_computed"] == len(turns)
    assert first.precision == "fp32"
    for t in turns:  # one value per output token, under the digest of exactly these ids
        r = first.reference[t.turn_id]
        assert len(r.logprobs) == len(t.output_token_ids) and r.ids_digest == ids_digest(t.prompt_token_ids, t.output_token_ids)
        assert all(x < 0 for x in r.logprobs)

    again = train_step(tiny, None, turns, cfg, tmp_path / "b", seed=0, reference=first.reference)
    assert again.steps[0]["reference_read"] == len(turns) and again.summary["reference_computed"] == 0
    a, b = _lora_state(first.adapter_dir), _lora_state(again.adapter_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)        # the same numbers, one forward fewer
    assert again.steps[0]["kl"] == first.steps[0]["kl"]

    # the kept values are what the loss reads: shifted ones change the KL the step reports
    shifted = {k: Reference(r.ids_digest, [x - 1.0 for x in r.logprobs]) for k, r in first.reference.items()}
    moved = train_step(tiny, None, turns, cfg, tmp_path / "c", seed=0, reference=shifted)
    assert moved.steps[0]["reference_read"] == len(turns) and moved.steps[0]["kl"] != pytest.approx(first.steps[0]["kl"])


def test_a_reference_of_other_ids_is_recomputed_for_that_turn_alone(tiny, tok, tmp_path):
    turns = _turns(tok)
    cfg = _cfg(steps=1)
    first = train_step(tiny, None, turns, cfg, tmp_path / "a", seed=0)
    kept = dict(first.reference)
    retok = turns[0].turn_id                  # the lake's ids for this turn changed (say, re-tokenized)
    kept[retok] = Reference(ids_digest([1, 2], [3]), kept[retok].logprobs)
    short = turns[1].turn_id                  # a truncated row: wrong length
    kept[short] = Reference(kept[short].ids_digest, kept[short].logprobs[:-1])
    res = train_step(tiny, None, turns, cfg, tmp_path / "b", seed=0, reference=kept)
    assert res.steps[0]["reference_read"] == len(turns) - 2 and set(res.reference) == {retok, short}
    assert res.reference[retok].logprobs == pytest.approx(first.reference[retok].logprobs, abs=1e-5)
    assert res.reference[short].logprobs == pytest.approx(first.reference[short].logprobs, abs=1e-5)
    # a small batch's later epochs read what the first computed
    epochs = train_step(tiny, None, turns[:2], dataclasses.replace(cfg, optimizer=dataclasses.replace(
        cfg.optimizer, steps_per_iteration=3)), tmp_path / "e", seed=0)
    assert [s["reference_read"] for s in epochs.steps] == [0, 2, 2] and epochs.summary["reference_computed"] == 2
