"""Requests not to be trained on (evaluation traffic, users without consent), through the real
gateway, tiny vLLM and Kafka: ``X-Tracerl-Train: false`` or ``tracerl.train: false`` is recorded on
the turn, the turn lands and gets its reward, and neither the learner's new turns nor its replay
ever holds it, while its unmarked twin (the same prompt) is in both. Any other value is a 400
naming the field."""

from __future__ import annotations

import copy
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.deploy.conftest import KEYS
from tests.deploy.gateway_http import call, is_openai_error
from tests.deploy.test_gateway import kafka_events

HEADER = "X-Tracerl-Train"
ABSENT = object()


def chat(url: str, content: str, header: str | None = None, train=ABSENT, max_tokens: int = 2):
    ext = {} if train is ABSENT else {"tracerl": {"train": train}}
    body = {"model": "support", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **ext}
    return call(f"{url}/v1/chat/completions", KEYS["acme"], body, headers={HEADER: header} if header is not None else None)


@pytest.mark.slow
def test_a_turn_marked_not_for_training_lands_gets_a_reward_and_is_never_trained_on(boundary, tmp_path):
    from pipelines.ingest.run import run_ingest
    from pipelines.lake.query import connect
    from pipelines.reward.engine import run_rewards
    from pipelines.train.replay import replay_pool
    from pipelines.lake.ledger import record_ledger
    from pipelines.train.run import new_training_turns

    cfg = copy.deepcopy(boundary.cfg)  # the boundary's topic, a lake and consumer group of this test's own
    cfg.lake_root, cfg.kafka.group_id = tmp_path / "lake", f"g-{uuid.uuid4().hex[:8]}"
    prompt = f"Tell me about order {uuid.uuid4().hex[:6]}."
    turns = {}
    for label, kw in (("twin", {}), ("header", {"header": "false"}), ("body", {"train": False}),
                      ("consented", {"header": "true", "train": True})):
        status, out = chat(boundary.url, prompt, **kw)
        assert status == 200, out
        turns[label] = out["tracerl"]
        assert out["tracerl"]["train"] is (label in ("twin", "consented")), out["tracerl"]  # the effective flag
        status, fb = call(f"{boundary.url}/v1/feedback", KEYS["acme"], {
            "type": "feedback", "trace_id": out["tracerl"]["trace_id"], "turn_id": out["tracerl"]["turn_id"],
            "kind": "thumbs", "value": 1})
        assert status == 202, fb
    ids = {label: t["turn_id"] for label, t in turns.items()}
    sent = kafka_events(cfg, set(ids.values()))
    assert {label: sent[i]["train"] for label, i in ids.items()} == {
        "twin": True, "header": False, "body": False, "consented": True}

    run_ingest(cfg)
    con = connect(cfg.lake)
    landed = dict(con.execute("SELECT turn_id, train FROM turns WHERE turn_id IN (SELECT unnest(?))",
                              [list(ids.values())]).fetchall())
    assert landed == {ids["twin"]: True, ids["header"]: False, ids["body"]: False, ids["consented"]: True}
    run_rewards(cfg.lake, now=datetime.now(timezone.utc) + timedelta(days=7))
    rewarded = {r[0] for r in connect(cfg.lake).execute(
        "SELECT turn_id FROM rewards WHERE settled AND labelled AND turn_id IN (SELECT unnest(?))",
        [list(ids.values())]).fetchall()}
    assert rewarded == set(ids.values())  # marked turns still get their reward

    new = {t.turn_id for t in new_training_turns(cfg, "acme", "support", limit=100_000)}
    assert {ids["twin"], ids["consented"]} <= new and not {ids["header"], ids["body"]} & new
    # a ledger that credits every one of them (e.g. written by an older learner): replay still
    # re-checks the flag
    record_ledger(cfg.table_store, "acme", "support", list(ids.values()), 1)
    pool = {p.turn.turn_id for p in replay_pool(cfg, "acme", "support")}
    assert {ids["twin"], ids["consented"]} <= pool and not {ids["header"], ids["body"]} & pool


def _expected(header, body):
    """(status, param or the recorded train value): the documented rule, written out."""
    if body is not ABSENT and body is not None and type(body) is not bool:
        return 400, "tracerl.train"
    given_header = None
    if header is not None:
        if header.strip().lower() not in ("true", "false"):
            return 400, HEADER
        given_header = header.strip().lower() == "true"
    given_body = None if body is ABSENT else body
    if given_header is not None and given_body is not None and given_header != given_body:
        return 400, "tracerl.train"
    return 200, next((v for v in (given_header, given_body) if v is not None), True)


_HEADER_TEXT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=8)
headers = st.none() | st.sampled_from(["true", "false", "TRUE", "False", "fAlSe", "1", "0", "yes", "no",
                                       "maybe", "null", "true,false"]) | _HEADER_TEXT
bodies = (st.just(ABSENT) | st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["false", "true", "maybe", ""])
          | st.floats(allow_nan=False, allow_infinity=False) | st.lists(st.booleans(), max_size=2)
          | st.dictionaries(st.sampled_from(["train"]), st.booleans(), max_size=1))


@pytest.mark.slow
def test_any_header_or_body_value_of_the_flag_is_recorded_or_a_400_naming_it(boundary):
    recorded: dict[str, bool] = {}

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(headers, bodies)
    def check(header, body):
        status, out = chat(boundary.url, "Say hi.", header=header, train=body, max_tokens=1)
        want_status, want = _expected(header, body)
        assert status == want_status, (header, body, out)
        if status == 400:
            assert is_openai_error(out) and out["error"]["param"] == want, out
            assert "train" in out["error"]["message"].lower(), out
        else:
            assert out["tracerl"]["train"] is want, (header, body, out["tracerl"])  # echoed as recorded
            recorded[out["tracerl"]["turn_id"]] = want

    check()
    assert True in recorded.values() and False in recorded.values()  # both outcomes were served
    events = kafka_events(boundary.cfg, set(recorded))
    assert {t: e["train"] for t, e in events.items()} == recorded


@pytest.mark.slow
def test_a_stream_echoes_the_flag_in_its_first_chunk_and_the_api_document_names_the_header(boundary):
    import json
    import urllib.request

    req = urllib.request.Request(f"{boundary.url}/v1/chat/completions", method="POST", data=json.dumps(
        {"model": "support", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2,
         "stream": True}).encode(), headers={"Authorization": f"Bearer {KEYS['acme']}",
                                             "Content-Type": "application/json", HEADER: "false"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        first = next(json.loads(line[6:]) for line in resp.read().decode().split("\n") if line.startswith("data: "))
    assert first["tracerl"]["train"] is False
    assert kafka_events(boundary.cfg, {first["tracerl"]["turn_id"]})[first["tracerl"]["turn_id"]]["train"] is False

    status, doc = call(f"{boundary.url}/openapi.json", None)
    chat_op = doc["paths"]["/v1/chat/completions"]["post"]
    header = next(p for p in chat_op["parameters"] if p["in"] == "header")
    assert status == 200 and header["name"] == HEADER and header["schema"]["enum"] == ["true", "false"]
    assert "tracerl.train" in header["description"] and "train" in chat_op["description"]
