"""End users and PII through the real gateway, tiny vLLM, Kafka and ingest (docs/privacy.md):

- the OpenAI ``user`` field (or ``X-Tracerl-User``; the body wins) is on every event the request
  makes, and on feedback, tool calls and session ends of its trace, as the tenant's pseudonym;
  the clear id is in no Kafka message and nowhere in the lake; a direct producer's clear id is
  pseudonymized at ingest, a non-string one quarantined with its reason;
- a bad user id (empty, too long, control characters, not a string) is a 400 naming the field;
- with a tenant's ``privacy.redact_pii``, e-mail addresses, phone, card and IBAN numbers are
  placeholders in what is recorded (messages, tool results, feedback text, tool-call arguments),
  while the client's answer keeps them; another tenant's records are untouched."""

from __future__ import annotations

import copy
import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.config import TracerlConfig
from pipelines.privacy.policy import Privacy
from pipelines.privacy.pseudonym import is_pseudonym, pseudonym
from tests.deploy.conftest import ADMIN, KEYS
from tests.deploy.gateway_http import call, is_openai_error
from tests.deploy.test_gateway import kafka_events

pytestmark = pytest.mark.slow
HEADER = "X-Tracerl-User"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat(url, tenant, content, user=None, header=None, trace=None, max_tokens=2, **fields):
    body = {"model": "support", "messages": [{"role": "user", "content": content}] if isinstance(content, str)
            else content, "max_tokens": max_tokens, **fields}
    if user is not None:
        body["user"] = user
    if trace:
        body["tracerl"] = {"trace_id": trace}
    return call(f"{url}/v1/chat/completions", KEYS[tenant], body, headers={HEADER: header} if header else None)


def feedback(url, tenant, body, header=None):
    return call(f"{url}/v1/feedback", KEYS[tenant], body, headers={HEADER: header} if header else None)


def topic_values(cfg) -> list[bytes]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(cfg.kafka.topic, bootstrap_servers=cfg.kafka.bootstrap_servers,
                             auto_offset_reset="earliest", group_id=None, consumer_timeout_ms=1500)
    values = [m.value for m in consumer]
    consumer.close()
    return values


def test_the_user_is_on_every_event_of_the_request_as_the_tenant_s_pseudonym_and_never_in_clear(boundary, tmp_path):
    from pipelines.contract.events import Feedback
    from pipelines.ingest.producer import TraceProducer
    from pipelines.ingest.run import run_ingest
    from pipelines.lake.query import connect

    url, cfg = boundary.url, boundary.cfg
    raw, other = f"alice-{uuid.uuid4().hex[:8]}@example.com", f"bob-{uuid.uuid4().hex[:8]}"
    p, p_other = pseudonym(cfg, "acme", raw), pseudonym(cfg, "acme", other)
    status, first = chat(url, "acme", "Weather in Oslo?", user=raw, tools=[WEATHER])
    assert status == 200, first
    trace, t1 = first["tracerl"]["trace_id"], first["tracerl"]["turn_id"]
    cid = "call_0_" + t1
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "tool_call_id": cid, "content": '{"temp_c": 4}'}]
    status, second = chat(url, "acme", history, header=raw, trace=trace, tools=[WEATHER])  # the header alone
    assert status == 200, second
    status, third = chat(url, "acme", "And tomorrow?", user=raw, header=other, trace=trace)  # the body wins
    assert status == 200, third
    t2, t3 = second["tracerl"]["turn_id"], third["tracerl"]["turn_id"]
    fb_own = feedback(url, "acme", {"trace_id": trace, "turn_id": t1, "kind": "thumbs", "value": 1, "user": raw})[1]
    fb_trace = feedback(url, "acme", {"trace_id": trace, "turn_id": t2, "kind": "thumbs", "value": -1})[1]
    fb_header = feedback(url, "acme", {"trace_id": trace, "turn_id": t3, "kind": "comment", "text": "ok"},
                         header=other)[1]
    end = feedback(url, "acme", {"type": "session_end", "trace_id": trace, "outcome": "completed"})[1]
    status, anonymous = chat(url, "acme", "Hello.")
    status_g, globex = chat(url, "globex", "Hello.", user=raw)
    assert status == status_g == 200
    ids = {t1, t2, t3, anonymous["tracerl"]["turn_id"], globex["tracerl"]["turn_id"], f"result-{cid}",
           fb_own["event_id"], fb_trace["event_id"], fb_header["event_id"], end["event_id"]}
    got = kafka_events(cfg, ids)
    users = {k: got[k].get("user") for k in ids}
    assert users == {t1: p, t2: p, t3: p, f"result-{cid}": p, fb_own["event_id"]: p, fb_trace["event_id"]: p,
                     end["event_id"]: p, fb_header["event_id"]: p_other, anonymous["tracerl"]["turn_id"]: None,
                     globex["tracerl"]["turn_id"]: pseudonym(cfg, "globex", raw)}
    assert is_pseudonym(p) and p != pseudonym(cfg, "globex", raw) and p != p_other
    assert not any(raw.encode() in v or other.encode() in v for v in topic_values(cfg))  # never in clear

    # a direct producer: its own id is pseudonymized at ingest, a non-string one quarantined
    direct_user = f"carol-{uuid.uuid4().hex[:8]}"
    sent = Feedback(tenant="acme", app="direct", trace_id="direct-trace", turn_id=t1, kind="accept", user=direct_user)
    bad = {**Feedback(tenant="acme", app="direct", trace_id="direct-trace", turn_id=t1, kind="accept").to_dict(),
           "user": 12345}
    with TraceProducer(cfg) as producer:
        producer.send(sent)
        producer.send_raw(b"direct-trace", json.dumps(bad).encode(), bad["event_id"])
    lake_cfg = copy.deepcopy(cfg)
    lake_cfg.lake_root, lake_cfg.kafka.group_id = tmp_path / "lake", f"g-{uuid.uuid4().hex[:8]}"
    run_ingest(lake_cfg)
    con = connect(lake_cfg.lake)
    turns = dict(con.execute("SELECT turn_id, user_id FROM turns WHERE trace_id = ?", [trace]).fetchall())
    assert turns == {t1: p, t2: p, t3: p}
    fb = dict(con.execute("SELECT event_id, user_id FROM feedback WHERE event_id IN (?, ?, ?)",
                          [fb_own["event_id"], fb_header["event_id"], sent.event_id]).fetchall())
    assert fb == {fb_own["event_id"]: p, fb_header["event_id"]: p_other,
                  sent.event_id: pseudonym(cfg, "acme", direct_user)}
    assert con.execute("SELECT user_id FROM tool_calls WHERE event_id = ?", [f"result-{cid}"]).fetchone() == (p,)
    assert con.execute("SELECT user_id FROM session_ends WHERE event_id = ?", [end["event_id"]]).fetchone() == (p,)
    stored = json.loads(con.execute("SELECT payload FROM events WHERE event_id = ?", [sent.event_id]).fetchone()[0])
    assert stored["user"] == pseudonym(cfg, "acme", direct_user) and stored["kind"] == "accept"
    reason, error = con.execute("SELECT reason, error FROM quarantine WHERE decode(raw_value) LIKE ?",
                                [f"%{bad['event_id']}%"]).fetchone()
    assert reason == "wrong_type" and error.startswith("wrong_type: user must be a string")
    everything = str(con.execute("SELECT * FROM events").fetchall())
    assert raw not in everything and other not in everything and direct_user not in everything


BAD_USERS = [("", "user"), ("x" * 257, "user"), ("a\nb", "user"), ("tab\there", "user"), ("\u2028", "user"),
             (5, "user"), (["alice"], "user"), ({"id": 1}, "user"), (True, "user")]


@pytest.mark.parametrize("user, param", BAD_USERS)
def test_a_bad_user_id_is_a_400_naming_the_field_and_nothing_is_recorded(boundary, user, param):
    marker = uuid.uuid4().hex
    before = boundary.gateway.counts["requests"]
    status, out = chat(boundary.url, "acme", f"hello {marker}", user=user)
    assert status == 400 and is_openai_error(out) and out["error"]["param"] == param, out
    assert boundary.gateway.counts["requests"] == before  # refused before vLLM was asked or anything recorded
    status, out = feedback(boundary.url, "acme", {"trace_id": "0" * 32 + "-" + "0" * 16, "turn_id": "x",
                                                  "kind": "thumbs", "value": 1, "user": user})
    assert status == 400 and out["error"]["param"] == "user", out


@pytest.mark.parametrize("header", ["x" * 257, "a\tb"])  # (other control characters: aiohttp refuses the request itself)
def test_a_bad_user_header_is_a_400_naming_the_header(boundary, header):
    status, out = chat(boundary.url, "acme", "hello", header=header)
    # OpenAI's codes: too long is string_above_max_length, a control character an invalid_value
    want = "string_above_max_length" if len(header) > 256 else "invalid_value"
    assert status == 400 and out["error"]["param"] == HEADER and out["error"]["code"] == want, out


@pytest.mark.parametrize("header", ["x" * 257, "a\tb"])
def test_a_bad_user_header_is_a_400_on_feedback_too(boundary, header):
    status, out = chat(boundary.url, "acme", "hello")
    t = out["tracerl"]
    status, out = feedback(boundary.url, "acme", {"trace_id": t["trace_id"], "turn_id": t["turn_id"],
                                                  "kind": "thumbs", "value": 1}, header=header)
    assert status == 400 and out["error"]["param"] == HEADER, out


def test_any_user_value_is_recorded_as_a_pseudonym_or_refused_by_the_contract_s_rule(boundary):
    from pipelines.contract.validate import user_problem

    served: dict[str, str] = {}

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.text(max_size=300) | st.integers() | st.none())
    def check(user):
        status, out = chat(boundary.url, "acme", "Hi.", user=user, max_tokens=1)
        ok = user is None or (isinstance(user, str) and user_problem(user) is None)
        assert status == (200 if ok else 400), (user, out)
        if status == 400:
            assert out["error"]["param"] == "user", out
        elif user is not None:
            served[out["tracerl"]["turn_id"]] = pseudonym(boundary.cfg, "acme", user)

    check()
    got = kafka_events(boundary.cfg, set(served))
    assert {k: e["user"] for k, e in got.items()} == served


PII = {"email": "jane.doe@example.com", "phone": "+44 20 7946 0958", "card": "4111 1111 1111 1111",
       "iban": "DE89 3704 0044 0532 0130 00"}


@pytest.fixture
def globex_redacts(boundary, monkeypatch):
    """The boundary gateway with ``[targets."globex".privacy] redact_pii = true`` (acme as before)."""
    cfg = TracerlConfig.from_dict({**boundary.cfg.to_dict(), "targets": {"globex": {"privacy": {"redact_pii": True}}}})
    monkeypatch.setattr(boundary.gateway, "privacy", Privacy(cfg))
    return boundary


def test_pii_is_redacted_from_what_is_recorded_for_a_tenant_that_asks_and_the_answer_keeps_it(globex_redacts):
    url, cfg = globex_redacts.url, globex_redacts.cfg
    said = (f"I am {PII['email']}, call {PII['phone']}; card {PII['card']}, IBAN {PII['iban']}. "
            f"Version 1.2.3 on 2024-01-15.")
    card_tool = {"type": "function", "function": {"name": "4111111111111111", "parameters": {"type": "object"}}}
    runs = {}
    for tenant in ("globex", "acme"):
        status, out = chat(url, tenant, said, tools=[card_tool], return_token_ids=True,
                           tool_choice={"type": "function", "function": {"name": "4111111111111111"}})
        assert status == 200, out
        assert "4111111111111111" in json.dumps(out["choices"][0]["message"])  # the answer keeps it
        t = out["tracerl"]
        cid = "call_0_" + t["turn_id"]
        history = [{"role": "user", "content": said},
                   {"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function", "function": {
                       "name": "get_weather", "arguments": json.dumps({"city": "Oslo", "notify": PII["email"]})}}]},
                   {"role": "tool", "tool_call_id": cid, "content": json.dumps({"error": f"call {PII['phone']}"})}]
        status, second = chat(url, tenant, history, trace=t["trace_id"], tools=[WEATHER])
        assert status == 200, second
        fb = feedback(url, tenant, {"trace_id": t["trace_id"], "turn_id": t["turn_id"], "kind": "edit",
                                    "text": f"Write to {PII['email']}, IBAN {PII['iban']}"})[1]
        tc = feedback(url, tenant, {"type": "tool_call", "trace_id": t["trace_id"], "turn_id": t["turn_id"],
                                    "name": "pay", "outcome": "ok", "arguments": {"card": PII["card"], "n": 2}})[1]
        runs[tenant] = dict(turn=t["turn_id"], second=second["tracerl"]["turn_id"], result=f"result-{cid}",
                            fb=fb["event_id"], tc=tc["event_id"], prompt_ids=out["prompt_token_ids"])
    got = kafka_events(cfg, {v for r in runs.values() for k, v in r.items() if k != "prompt_ids"})
    g, a = runs["globex"], runs["acme"]
    for key in ("turn", "second", "result", "fb", "tc"):
        text = json.dumps(got[g[key]])
        assert not any(v in text for v in PII.values()) and "4111111111111111" not in text, (key, text)
    turn = got[g["turn"]]
    assert turn["input_messages"][-2]["content"] == ("I am [EMAIL], call [PHONE]; card [CARD], IBAN [IBAN]. "
                                                     "Version 1.2.3 on 2024-01-15.")
    assert "[CARD]" in turn["input_messages"][0]["content"] and "[CARD]" in turn["input_messages"][-1]["content"]
    assert "prompt_token_ids" not in turn  # the ids would spell the redacted text out again
    assert got[g["second"]]["input_messages"][-1]["content"] == '{"error": "call [PHONE]"}'
    assert got[g["result"]]["arguments"] == {"city": "Oslo", "notify": "[EMAIL]"}
    assert got[g["result"]]["error"] == "call [PHONE]" and got[g["result"]]["outcome"] == "error"
    assert got[g["fb"]]["text"] == "Write to [EMAIL], IBAN [IBAN]"
    assert got[g["tc"]]["arguments"] == {"card": "[CARD]", "n": 2}
    # acme does not redact: the same requests are recorded as sent
    assert PII["card"] in got[a["turn"]]["input_messages"][-2]["content"]
    assert got[a["turn"]]["prompt_token_ids"] == a["prompt_ids"]
    assert got[a["fb"]]["text"] == f"Write to {PII['email']}, IBAN {PII['iban']}"
    status, stats = call(f"{url}/admin/stats", ADMIN)
    assert stats["gateway"]["redacted_events"] >= 5


def test_forget_and_consent_over_http_act_for_the_caller_s_own_tenant_only(boundary):
    """`POST /admin/forget` files the request (pseudonym only, 202, idempotent) for `forget_job`;
    `POST /admin/consent` records an opt-out; the admin key or the tenant's own key may ask, another
    tenant's key is a 403, an unknown tenant a 404, a bad body a 400 naming the field."""
    from pipelines.lake.consent import records
    from pipelines.privacy import forget_requests

    url, cfg = boundary.url, boundary.cfg
    raw = f"dora-{uuid.uuid4().hex[:8]}"
    status, out = call(f"{url}/admin/forget", KEYS["acme"], {"tenant": "acme", "user": raw})
    assert status == 202 and out["status"] == "requested" and out["user"] == pseudonym(cfg, "acme", raw), out
    path = forget_requests.request_path(cfg.home, "acme", out["user"])
    assert path.is_file() and raw not in path.read_text()
    again = call(f"{url}/admin/forget", ADMIN, {"tenant": "acme", "user": raw, "who": "dpo"})
    assert again == (202, out)  # an open request is returned as it is
    status, out = call(f"{url}/admin/forget", KEYS["globex"], {"tenant": "acme", "user": raw})
    assert status == 403 and out["error"]["param"] == "tenant", out
    status, out = call(f"{url}/admin/forget", "not-a-key", {"tenant": "acme", "user": raw})
    assert status == 401, out
    status, out = call(f"{url}/admin/forget", ADMIN, {"tenant": "nobody", "user": raw})
    assert status == 404 and out["error"]["param"] == "tenant", out
    for body, param in (({"tenant": "acme"}, "user"), ({"tenant": "acme", "user": ""}, "user"),
                        ({"tenant": "acme", "user": raw, "extra": 1}, "extra")):
        status, out = call(f"{url}/admin/forget", ADMIN, body)
        assert status == 400 and out["error"]["param"] == param, (body, out)

    status, out = call(f"{url}/admin/consent", KEYS["acme"], {"tenant": "acme", "user": raw, "consent": False,
                                                              "reason": "asked in the app"})
    assert status == 200 and out["consent"] is False and out["user"] == pseudonym(cfg, "acme", raw), out
    assert out["actor"] == "tenant:acme"
    [rec] = records(cfg, "acme", pseudonym(cfg, "acme", raw))
    assert rec.consent is False and raw not in json.dumps(rec.to_dict())
    status, out = call(f"{url}/admin/consent", ADMIN, {"tenant": "acme", "user": raw, "consent": "no"})
    assert status == 400 and out["error"]["param"] == "consent", out
    status, out = call(f"{url}/admin/consent", KEYS["globex"], {"tenant": "acme", "user": raw, "consent": True})
    assert status == 403, out
    assert len(records(cfg, "acme", pseudonym(cfg, "acme", raw))) == 1  # nothing else recorded
