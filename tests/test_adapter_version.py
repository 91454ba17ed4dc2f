"""The adapter version is an int everywhere: every text form tracerl writes (folder, lora name,
registry tag, report label) parses back to the same int, and a malformed registry tag is an error
naming it, not a silent miss."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlflow.entities.model_registry import ModelVersion, ModelVersionTag

from pipelines.adapters.store import AdapterStore
from pipelines.adapters.version import folder_version, label, lora_name, parse_version, tag_version

versions = st.integers(min_value=1, max_value=10**9)


@given(versions, st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True),
       st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True))
def test_every_written_form_parses_back(n, tenant, task):
    assert parse_version(label(n)) == n                    # reports, CLI arguments
    assert parse_version(lora_name(tenant, task, n)) == n  # vLLM's lora_name
    assert tag_version(_mv(str(n))) == n                   # the registry's adapter_version tag
    assert folder_version(label(n)) == n                   # the adapter-store folder


def test_base_and_garbage():
    assert label(None) == "base" and parse_version(None) == 0
    assert parse_version("latest") is None and parse_version("v") is None
    assert folder_version(".tmp-v3-1-abc") is None and folder_version("v3x") is None


def _mv(tag):
    """A registry model version as MLflow's client returns it."""
    return ModelVersion("acme.support", "7", 0, tags=[] if tag is None else [ModelVersionTag("adapter_version", tag)])


@pytest.mark.parametrize("tag", ["v3", "", "3.0", "-1", None])
def test_a_registry_tag_that_is_not_a_number_is_an_error_naming_it(tag):
    with pytest.raises(ValueError, match=r"acme.support version 7: its adapter_version tag is"):
        tag_version(_mv(tag))


def test_the_store_names_versions_with_the_same_formatter(tmp_path):
    folder = tmp_path / "acme" / "support"
    for name in ("v2", "v10", ".tmp-v11-1-abc", "notes"):
        (folder / name).mkdir(parents=True)
    for name in ("v2", "v10"):
        (folder / name / "READY").write_text("{}")
        (folder / name / "tracerl.json").write_text("{}")
    store = AdapterStore(tmp_path)
    assert [a.version for a in store.list("acme", "support")] == [2, 10]
    assert store.latest("acme", "support").name == "acme/support/v10"
    assert store.next_version("acme", "support") == 11
