"""The gate's kept eval replies (pipelines/gate/reply_cache.py): keyed by the weights, so other
weights never get another model's replies; a damaged file costs regeneration, never a wrong reply."""

from __future__ import annotations

from pipelines.gate.reply_cache import ReplyCache, weights_key


def adapter(folder, weights: bytes):
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 16}')
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


def test_the_key_follows_the_weights_not_the_folder(tmp_path):
    a, same, other = adapter(tmp_path / "a", b"w1"), adapter(tmp_path / "b", b"w1"), adapter(tmp_path / "c", b"w2")
    assert weights_key("base", a) == weights_key("base", same)            # a copy elsewhere: the same weights
    assert len({weights_key("base", a), weights_key("base", other), weights_key("base2", a),
                weights_key("base", None)}) == 4


def test_replies_survive_a_new_process_and_a_damaged_file_starts_over(tmp_path):
    entry = ReplyCache.entry("h1", 7, 1.0, 1.0, 64)
    c = ReplyCache(tmp_path, "k")
    assert c.get(entry) is None
    c.put(entry, "It is secret-1.")
    c.save()
    again = ReplyCache(tmp_path, "k")
    assert again.get(entry) == "It is secret-1." and again.hits == 1
    assert again.get(ReplyCache.entry("h1", 8, 1.0, 1.0, 64)) is None      # another seed
    assert again.get(ReplyCache.entry("h1", 7, 0.7, 1.0, 64)) is None      # other sampling
    for junk in ("{not json", "[1, 2]", '{"x": 3}'):
        (tmp_path / "k.json").write_text(junk)
        assert ReplyCache(tmp_path, "k").get(entry) is None
