"""The replica set under any sequence of outages, returns and picks: requests go only to replicas
serving while any is, evenly; with none serving, to any not tried yet; a request that tried
them all gets NoReplica. Probes take a replica out only after the configured failures in a row."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.deploy.upstreams import NoReplica, Upstreams

URLS = [f"http://10.0.0.{i}:8000" for i in range(4)]
ops = st.lists(st.one_of(st.tuples(st.just("down"), st.integers(0, 3)), st.tuples(st.just("up"), st.integers(0, 3)),
                         st.tuples(st.just("pick"), st.integers(1, 6))), max_size=40)


@given(n=st.integers(1, 4), steps=ops)
def test_picks_go_to_replicas_serving_evenly_and_to_any_when_none_is(n, steps):
    urls = URLS[:n]
    u = Upstreams(urls)
    out: set[str] = set()
    for op, arg in steps:
        if op == "down":
            u.mark_down(urls[arg % n], "probe failed")
            out.add(urls[arg % n])
        elif op == "up":
            u.mark_up(urls[arg % n])
            out.discard(urls[arg % n])
        else:
            picks = [u.pick() for _ in range(arg)]
            serving = [x for x in urls if x not in out]
            assert set(u.serving()) == set(serving)
            pool = serving or urls
            assert set(picks) <= set(pool)
            for i in range(0, len(picks) - len(pool) + 1):  # a round of len(pool) picks: each once
                assert len(set(picks[i:i + len(pool)])) == len(pool)
    with pytest.raises(NoReplica):
        u.pick(tried=urls)
    assert sum(r["requests"] for r in u.stats()) == sum(a for op, a in steps if op == "pick")


@given(results=st.lists(st.booleans(), max_size=30), need=st.integers(1, 4))
def test_probes_take_a_replica_out_after_failures_in_a_row_and_bring_it_back_when_it_answers(results, need):
    u = Upstreams(URLS[:2])
    url, row, serving = URLS[0], 0, True
    for ok in results:
        todo = u.probed(url, ok, "" if ok else "/health: refused", need)
        row = 0 if ok else row + 1
        if ok:
            assert todo == ("" if serving else "back")
            if todo == "back":  # the deployer restores it, then puts it back
                u.mark_up(url)
                serving = True
        else:
            assert todo == ("out" if serving and row >= need else "")
            if todo == "out":
                u.mark_down(url, "/health: refused")
                serving = False
        assert (url in u.serving()) == serving
    assert URLS[1] in u.serving()  # the other replica was never touched


def test_a_gateway_sees_the_names_its_peers_route_or_hold_but_not_its_own(tmp_path):
    """What keeps one gateway from unloading a version another still serves (pipelines/deploy/peers.py)."""
    from pipelines.deploy.peers import Holds, held_by_others
    from pipelines.deploy.routing import Canary, Router

    home = tmp_path
    single, a, b = home / "deploy", home / "gateways" / "a" / "deploy", home / "gateways" / "b" / "deploy"
    Router(single / "routes.json").flip("acme", "support", 3, "/adapters/acme/support/v3")
    ra = Router(a / "routes.json")
    ra.flip("acme", "support", 4, "/adapters/acme/support/v4")
    ra.start_canary("acme", "support", Canary(5, "/adapters/acme/support/v5", 0.1, "c" * 32, "2026-12-05T00:00:00Z"))
    hb = Holds(b)
    hb.add("globex/support/v2")  # b is loading it
    assert held_by_others(home, a) == {"acme/support/v3", "globex/support/v2"}
    assert held_by_others(home, b) == {"acme/support/v3", "acme/support/v4", "acme/support/v5"}
    hb.discard("globex/support/v2")  # loaded and routed, or given up
    assert held_by_others(home, a) == {"acme/support/v3"}
    (a / "routes.json").write_text("{not json")  # being replaced, or from another release: no names, no crash
    assert held_by_others(home, b) == {"acme/support/v3"}
