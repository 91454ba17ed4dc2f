"""The adapter store: versions, metadata round-trip, lineage, atomic publication, safe ids."""

from __future__ import annotations

import json
import os

import pytest

from pipelines.adapters.store import META, READY, AdapterStore, check_id, write_folder_atomically


def _peft_folder(path, tag: str):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "tag": tag}))
    (path / "adapter_model.safetensors").write_bytes(tag.encode() * 10)
    return path


def _meta(parent, **extra):
    return {"parent_version": parent, "base_model_hash": "ab" * 32,
            "data_window": {"turn_ids": ["t1", "t2"], "lake_files": ["lake/part-0.parquet"]},
            "reward_spec_version": "rewards-v2", "config": {"seed": 0, "lora": {"r": 8}},
            "metrics": {"loss": 0.5}, **extra}


def test_publish_list_latest_get_and_lineage_round_trip(tmp_path):
    store = AdapterStore(tmp_path / "adapters")
    assert store.latest("acme", "support") is None and store.list("acme", "support") == []
    assert store.next_version("acme", "support") == 1
    v1 = store.publish("acme", "support", _peft_folder(tmp_path / "s1", "one"), _meta(None))
    v2 = store.publish("acme", "support", _peft_folder(tmp_path / "s2", "two"), _meta(1, metrics={"loss": 0.25}))
    other = store.publish("acme", "code", _peft_folder(tmp_path / "s3", "three"), _meta(None))

    assert (v1.version, v2.version, other.version) == (1, 2, 1)
    assert v2.path == tmp_path / "adapters" / "acme" / "support" / "v2" and v2.name == "acme/support/v2"
    assert (v2.path / "adapter_model.safetensors").read_bytes() == b"two" * 10
    assert (v2.path / READY).is_file()
    assert [v.version for v in store.list("acme", "support")] == [1, 2]
    assert store.latest("acme", "support").version == 2
    got = store.get("acme", "support", 2)
    assert got.meta == json.loads((v2.path / META).read_text()) == v2.meta
    assert got.meta["metrics"] == {"loss": 0.25} and got.meta["data_window"]["lake_files"] == ["lake/part-0.parquet"]
    assert got.meta["base_model_hash"] == "ab" * 32 and got.meta["reward_spec_version"] == "rewards-v2"
    assert got.meta["config"]["lora"]["r"] == 8 and got.meta["created_at"]
    assert [v.version for v in store.lineage("acme", "support", 2)] == [2, 1]
    with pytest.raises(KeyError):
        store.get("acme", "support", 3)


def test_publish_rejects_bad_input(tmp_path):
    store = AdapterStore(tmp_path)
    src = _peft_folder(tmp_path / "src", "x")
    with pytest.raises(ValueError, match="not a published version"):
        store.publish("acme", "support", src, _meta(7))
    with pytest.raises(ValueError, match="lacks"):
        store.publish("acme", "support", src, {"parent_version": None})
    with pytest.raises(ValueError, match="assigns"):
        store.publish("acme", "support", src, _meta(None, version=9))
    with pytest.raises(FileNotFoundError):
        store.publish("acme", "support", tmp_path, _meta(None))
    for bad in ("../x", "a/b", "..", ".hidden", "", "a b", "x" * 200):
        with pytest.raises(ValueError, match="safe id"):
            check_id(bad, "tenant")
        with pytest.raises(ValueError, match="safe id"):
            store.latest(bad, "support")
    assert check_id("acme-1.prod_2", "tenant") == "acme-1.prod_2"
    assert store.list("acme", "support") == []


def test_crash_mid_publish_is_invisible_to_readers(tmp_path):
    store = AdapterStore(tmp_path / "adapters")
    store.publish("acme", "support", _peft_folder(tmp_path / "s1", "one"), _meta(None))
    task = tmp_path / "adapters" / "acme" / "support"
    # a publisher died after copying files but before READY + rename
    crashed = task / f".tmp-v2-{os.getpid()}-deadbeef"
    _peft_folder(crashed, "half")
    # and a v<N> folder someone created by hand, without READY
    _peft_folder(task / "v3", "manual")

    assert [v.version for v in store.list("acme", "support")] == [1]
    assert store.latest("acme", "support").version == 1
    with pytest.raises(KeyError):
        store.get("acme", "support", 3)
    # the next publish skips every number already on disk, finished or not
    v = store.publish("acme", "support", _peft_folder(tmp_path / "s4", "four"), _meta(1))
    assert v.version == 4 and store.latest("acme", "support").version == 4

    # a failing fill leaves nothing behind
    def boom(tmp):
        (tmp / "partial").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_folder_atomically(task / "v9", boom)
    assert not (task / "v9").exists() and sorted(p.name for p in task.glob(".tmp-v9*")) == []
    with pytest.raises(FileExistsError):
        write_folder_atomically(task / "v1", lambda tmp: None)
