"""Ingest never lands a user id in clear (pipelines/ingest/decode.py): a direct producer's own id
becomes the tenant's pseudonym in the stored payload (only that field changed) and in `user_id`;
a pseudonym is kept as it is; a `user` that breaks the contract's rule is quarantined with its
reason; the views read `user_id` on every event type, NULL on a lake from before the column."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.contract.events import Feedback, Message, ModelTurn, SessionEnd, ToolCall
from pipelines.contract.validate import user_problem
from pipelines.ingest import direct
from pipelines.ingest.decode import Chunk, decode_chunk
from pipelines.lake import delta
from pipelines.lake.delta import EVENTS
from pipelines.lake.query import connect
from pipelines.privacy.pseudonym import is_pseudonym, pseudonym


def turn(user=None, tenant="acme", **kw) -> dict:
    return ModelTurn(tenant=tenant, app="app", trace_id="tr", task="support", turn_index=0, model="m",
                     input_messages=[Message("user", "hi")], output_text="hello", user=user, **kw).to_dict()


def decode(values: list[bytes], home) -> tuple[pa.Table, pa.Table]:
    chunk = Chunk("t", 0, 0, list(range(len(values))), [1] * len(values), [None] * len(values), values)
    return decode_chunk(chunk, 1 << 20, "run", 1, home=None if home is None else str(home))


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("ingest-home")


@settings(max_examples=150, deadline=None)
@given(user=st.text(min_size=1, max_size=256).filter(lambda u: user_problem(u) is None), tenant=st.sampled_from(["acme", "globex"]))
def test_a_clear_user_id_lands_as_the_tenant_s_pseudonym_and_nothing_else_changes(home, user, tenant):
    sent = {"zz_unknown": [1, {"b": 2.5}], **turn(user, tenant)}  # key order and an unknown field kept
    events, quarantine = decode([json.dumps(sent, ensure_ascii=False).encode()], home)
    assert quarantine.num_rows == 0 and events.num_rows == 1
    p = user if is_pseudonym(user) else pseudonym(home, tenant, user)
    stored = events.column("payload")[0].as_py()
    assert json.loads(stored) == {**sent, "user": p} and list(json.loads(stored)) == list(sent)
    assert events.column("user_id").to_pylist() == [p]  # the payload is the message with only `user` changed


def test_a_pseudonym_and_a_missing_user_land_as_sent(home):
    p = pseudonym(home, "acme", "alice")
    values = [json.dumps(turn(p)).encode(), json.dumps(turn()).encode()]
    events, quarantine = decode(values, home)
    assert events.column("payload").to_pylist() == [v.decode() for v in values]  # the bytes as sent
    assert events.column("user_id").to_pylist() == [p, None] and quarantine.num_rows == 0


@pytest.mark.parametrize("user, reason, words", [
    (12345, "wrong_type", "user must be a string"), (["alice"], "wrong_type", "user must be a string"),
    (True, "wrong_type", "user must be a string"), ("", "invalid_value", "must not be empty"),
    ("x" * 257, "invalid_value", "over the 256-character limit"),
    ("alice\nsmith", "invalid_value", "control character U+000A"),
    ("bob\u2028", "invalid_value", "control character U+2028")])
def test_a_user_that_breaks_the_rule_is_quarantined_with_its_reason(home, user, reason, words):
    events, quarantine = decode([json.dumps({**turn(), "user": user}).encode()], home)
    assert events.num_rows == 0 and quarantine.column("reason").to_pylist() == [reason]
    error = quarantine.column("error")[0].as_py()
    assert words in error
    if isinstance(user, str) and len(user) > 3:
        assert user not in error  # the error does not repeat the id (the raw bytes keep the message)


def test_without_a_home_a_clear_id_is_never_landed(home):
    events, quarantine = decode([json.dumps(turn("alice")).encode(), json.dumps(turn()).encode()], None)
    assert events.num_rows == 1 and quarantine.column("reason").to_pylist() == ["internal_error"]


def test_a_version_1_event_keeps_its_text_adapter_version_in_the_payload(home):
    sent = {**turn("carol"), "schema_version": 1, "adapter_version": "v3"}
    events, _ = decode([json.dumps(sent).encode()], home)
    assert json.loads(events.column("payload")[0].as_py()) == {**sent, "user": pseudonym(home, "acme", "carol")}


def test_the_views_read_user_id_on_every_type_and_null_on_a_lake_from_before_it(tmp_path):
    root, h = tmp_path / "lake", tmp_path / "home"
    old = direct.events_table([ModelTurn(tenant="acme", app="a", trace_id="old", task="s", turn_index=0, model="m",
                                         input_messages=[], output_text="x")])
    delta.append(root, EVENTS, old.drop_columns(["user_id"]))  # files written before the column existed
    assert connect(root).execute("SELECT user_id FROM turns").fetchall() == [(None,)]
    p = pseudonym(h, "acme", "dana")
    events = [ModelTurn(tenant="acme", app="a", trace_id="new", task="s", turn_index=0, model="m", turn_id="t1",
                        input_messages=[], output_text="x", user="dana"),
              Feedback(tenant="acme", app="a", trace_id="new", turn_id="t1", kind="accept", user="dana"),
              ToolCall(tenant="acme", app="a", trace_id="new", turn_id="t1", name="f", outcome="ok", user=p),
              SessionEnd(tenant="acme", app="a", trace_id="new", outcome="completed", user="dana")]
    with pytest.raises(ValueError, match="names a user in clear"):
        direct.land(root, events)
    direct.land(root, events, home=h)
    con = connect(root)
    for view in ("turns", "feedback", "tool_calls", "session_ends"):
        assert con.execute(f"SELECT user_id FROM {view} WHERE trace_id = 'new'").fetchall() == [(p,)], view
    assert con.execute("SELECT user_id FROM turns WHERE trace_id = 'old'").fetchall() == [(None,)]
    assert "dana" not in str(con.execute("SELECT * FROM events").fetchall())
