"""End users as keyed pseudonyms (pipelines/privacy/pseudonym.py): deterministic per tenant,
different across tenants, never the clear id or any part of it, one format; the tenant's secret is
made once, 0600 in a 0700 folder, and processes that make it at once agree on it."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.contract.validate import IDENT
from pipelines.privacy import pseudonym as P

users = st.text(min_size=1, max_size=256)
tenants = st.from_regex(IDENT, fullmatch=True)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("privacy-home")


@settings(max_examples=300, deadline=None)
@given(tenant=tenants, user=users)
def test_a_pseudonym_is_deterministic_in_its_format_and_never_holds_the_clear_id(home, tenant, user):
    p = P.pseudonym(home, tenant, user)
    assert p == P.pseudonym(home, tenant, user) and P.is_pseudonym(p)
    assert p.startswith("u_") and len(p) == 34 and p != user
    if len(user) >= 4:  # any id of a few characters: not inside the pseudonym (hex digits could hold a tiny one)
        assert user not in p
    assert P.as_pseudonym(home, tenant, p) == p  # what ingest keeps as it is
    assert P.as_pseudonym(home, tenant, user) == (user if P.is_pseudonym(user) else p)


@settings(max_examples=200, deadline=None)
@given(a=tenants, b=tenants, user=users)
def test_the_same_user_of_two_tenants_has_two_pseudonyms(home, a, b, user):
    if a != b:
        assert P.pseudonym(home, a, user) != P.pseudonym(home, b, user)


@settings(max_examples=200, deadline=None)
@given(user=users, other=users)
def test_two_users_of_one_tenant_have_two_pseudonyms(home, user, other):
    if user != other:
        assert P.pseudonym(home, "acme", user) != P.pseudonym(home, "acme", other)


@given(st.text(max_size=40) | st.integers() | st.none() | st.binary(max_size=40))
def test_only_the_format_is_a_pseudonym(value):
    assert P.is_pseudonym(value) == (isinstance(value, str) and P.PATTERN.fullmatch(value) is not None)
    assert not P.is_pseudonym("U_" + "0" * 32) and not P.is_pseudonym("u_" + "0" * 31)
    assert not P.is_pseudonym("u_" + "A" * 32) and not P.is_pseudonym("u_" + "0" * 32 + "\n")


def test_the_secret_is_private_to_its_owner_and_survives_a_new_process(tmp_path):
    p = P.pseudonym(tmp_path, "acme", "alice")
    path = P.secret_path(tmp_path, "acme")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [f.name for f in path.parent.iterdir()] == ["acme.key"]  # no temporary file left behind
    P.clear_cache()
    assert P.pseudonym(tmp_path, "acme", "alice") == p  # read back, not made again


def _one(home: str, out) -> None:
    P.clear_cache()
    out.put(P.pseudonym(home, "acme", "alice"))


def test_processes_that_make_the_secret_at_once_agree_on_it(tmp_path):
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_one, args=(str(tmp_path), out)) for _ in range(6)]
    for p in procs:
        p.start()
    got = {out.get(timeout=30) for _ in procs}
    for p in procs:
        p.join(10)
    assert len(got) == 1 and got == {P.pseudonym(tmp_path, "acme", "alice")}


def test_a_damaged_secret_is_an_error_never_replaced(tmp_path):
    path = P.secret_path(tmp_path, "acme")
    path.parent.mkdir(parents=True)
    path.write_text("not a secret\n")
    P.clear_cache()
    with pytest.raises(P.SecretError, match="restore it from a backup"):
        P.pseudonym(tmp_path, "acme", "alice")
    assert path.read_text() == "not a secret\n"


@pytest.mark.parametrize("tenant", ["../etc", "", "a/b", ".hidden", "x" * 65])
def test_a_tenant_that_is_no_identifier_names_no_file(tmp_path, tenant):
    with pytest.raises(ValueError, match="tenant"):
        P.pseudonym(tmp_path, tenant, "alice")
    assert not any(tmp_path.rglob("*"))


def test_a_user_id_must_be_text(tmp_path):
    with pytest.raises(TypeError):
        P.pseudonym(tmp_path, "acme", 12345)  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []
