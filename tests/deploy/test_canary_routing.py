"""The canary's split in the router, without vLLM: sticky per conversation whatever the share does,
the share it promises, restored from routes.json, and ended by a stop or by promoting the
challenger (pipelines/deploy/routing.py)."""

from __future__ import annotations

import json
import math
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.deploy.routing import Canary, Router, bucket


def routed(tmp_path=None, share: float = 0.3) -> Router:
    router = Router(None if tmp_path is None else tmp_path / "routes.json")
    router.flip("acme", "qa", 1, "/a/v1")
    router.start_canary("acme", "qa", Canary(2, "/a/v2", share, uuid.uuid4().hex, "2026-12-02T00:00:00Z"))
    return router


def side(router: Router, key: str) -> tuple[int, str | None]:
    lease = router.acquire("acme", "qa", key)
    router.release(lease)
    return lease.version, lease.arm


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=30, unique=True),
       steps=st.lists(st.tuples(st.integers(0, 29), st.none() | st.floats(0.01, 0.99)), min_size=1, max_size=80))
def test_no_conversation_is_served_by_both_arms_whatever_the_share_does(keys, steps):
    """Requests of random conversations interleaved with random share changes: each conversation
    keeps the version of its first request, and the lease's arm names that version."""
    router = routed()
    first: dict[str, int] = {}
    for i, share in steps:
        if share is not None:
            router.set_share("acme", "qa", share)
            continue
        key = keys[i % len(keys)]
        version, arm = side(router, key)
        assert first.setdefault(key, version) == version
        assert arm == ("challenger" if version == 2 else "champion")


def test_the_challenger_gets_its_share_of_conversations():
    """Over 20000 conversations the challenger's share is within 4.5 binomial SEs of the share set."""
    n = 20_000
    for share in (0.05, 0.1, 0.5):
        router = routed(share=share)
        got = sum(side(router, f"trace:{i}")[1] == "challenger" for i in range(n)) / n
        assert abs(got - share) < 4.5 * math.sqrt(share * (1 - share) / n), (share, got)


def test_a_new_canary_draws_its_own_conversations():
    """Another canary id reshuffles: the conversations of one 10% canary are not those of the next."""
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    in_a = {i for i in range(5000) if bucket(a, f"trace:{i}") < 0.1}
    in_b = {i for i in range(5000) if bucket(b, f"trace:{i}") < 0.1}
    assert 0.05 < len(in_a & in_b) / len(in_a) < 0.2  # independent draws overlap by about the share


def test_the_canary_is_restored_from_routes_json_with_the_same_sides(tmp_path):
    """A restarted gateway (a new Router on the same file) serves the same canary, and each
    conversation is on the side it was on before, from the hash alone (no pins survive)."""
    router = routed(tmp_path, share=0.4)
    before = {k: side(router, k) for k in (f"trace:{i}" for i in range(300))}
    again = Router(tmp_path / "routes.json")
    assert again.live("acme", "qa").canary == router.live("acme", "qa").canary
    assert {k: side(again, k) for k in before} == before
    assert {v for v, _ in before.values()} == {1, 2}
    assert json.loads((tmp_path / "routes.json").read_text())[0]["canary"]["share"] == 0.4


def test_a_route_without_a_canary_reads_back_from_an_older_routes_json(tmp_path):
    (tmp_path / "routes.json").write_text(json.dumps(
        [{"tenant": "acme", "task": "qa", "version": 3, "path": "/a/v3", "history": []}]))
    assert side(Router(tmp_path / "routes.json"), "trace:x") == (3, None)


def test_stop_sends_every_new_request_to_the_champion_and_in_flight_ones_finish():
    router = routed(share=0.99)
    held = router.acquire("acme", "qa", "trace:held")
    assert held.arm == "challenger" and router.inflight("acme/qa/v2") == 1
    stopped = router.stop_canary("acme", "qa")
    assert stopped is not None and stopped.version == 2
    assert {side(router, f"trace:{i}") for i in range(50)} == {(1, None)}
    assert router.inflight("acme/qa/v2") == 1 and not router.wait_drained("acme/qa/v2", 0.01)
    router.release(held)
    assert router.wait_drained("acme/qa/v2", 1)
    assert router.stop_canary("acme", "qa") is None


def test_promoting_the_challenger_ends_the_canary_and_promoting_another_keeps_it():
    router = routed()
    router.flip("acme", "qa", 3, "/a/v3")   # another version becomes champion: the canary of v2 goes on
    assert router.live("acme", "qa").canary.version == 2
    router.flip("acme", "qa", 2, "/a/v2")   # the challenger becomes champion: one version again
    live = router.live("acme", "qa")
    assert live.version == 2 and live.canary is None
    assert {side(router, f"trace:{i}") for i in range(50)} == {(2, None)}
