"""A user without consent is never trained on: per-user consent records per tenant (issue #42, item 2).

One real Delta lake (events landed as ingest stores them, the real reward engine), shared by the
property test: mixed traffic of several users of two tenants, and random consent histories
(opt-outs and opt-ins at random times, some exactly at a turn's time; default true or false;
retroactive or not). For each history, the learner's selections (`new_training_turns`, labelled
and not, and `replay_pool`) hold exactly the turns the documented rule allows, written out here
as `allowed`; every turn is still in the rewards view (measured). Then the CLI and its bad input.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipelines.config import TracerlConfig
from pipelines.contract.events import ModelTurn
from pipelines.lake.consent import CONSENT, ConsentError, consent_source, record_consent, records
from pipelines.lake.ledger import record_ledger
from pipelines.lake.query import connect
from pipelines.privacy.pseudonym import pseudonym
from pipelines.reward.engine import run_rewards
from pipelines.train.replay import replay_pool
from pipelines.train.run import new_training_turns
from tests.reward.reward_lake import T0, at, fb, land, turn
from tracerl.cli import main

ACME, GLOBEX = "acme", "globex"
FRESH, REPLAYED = "fresh", "replayed"  # a task never trained (new turns), one whose turns the ledger credits
USERS = ["alice", "bob", "carol", "dave"]
TURNS_PER_USER = 6  # one a minute, interleaved: user k's i-th turn at minute 4 * i + k
MINUTES = TURNS_PER_USER * len(USERS)


def minute(m: float) -> datetime:
    return T0 + timedelta(minutes=m)


def _traffic(cfg: TracerlConfig) -> list[tuple[str, str, str, str | None, datetime, bool]]:
    """Land the mixed traffic; (tenant, task, turn id, raw user or None, event time, train flag) of each turn."""
    out, events = [], []
    for tenant in (ACME, GLOBEX):
        for task in (FRESH, REPLAYED):
            for m in range(MINUTES + 2):  # the last two minutes: turns with no user
                user = USERS[m % len(USERS)] if m < MINUTES else None
                tid = f"{tenant}-{task}-{m}"
                flag = m != 5  # one turn of a consenting user sent with train: false
                t = turn(tid, t=m * 60, tenant=tenant, task=task, trace_id=f"tr-{tid}")
                t = replace(t, user=pseudonym(cfg, tenant, user) if user else None, train=flag)
                events.append(t)
                if m % 3:  # two turns in three thumbed (labelled); the others get no signal
                    events.append(fb(tid, "thumbs", t=m * 60 + 10, value=1 if m % 2 else -1, tenant=tenant,
                                     task=task, trace_id=f"tr-{tid}"))
                out.append((tenant, task, tid, user, minute(m), flag))
    land(cfg.lake, events)
    run_rewards(cfg.lake, now=minute(MINUTES) + timedelta(days=7))
    return out


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """The shared lake: the traffic, its rewards, a ledger crediting every REPLAYED turn to v1."""
    cfg = TracerlConfig(home=tmp_path_factory.mktemp("consent") / "home")
    turns = _traffic(cfg)
    for tenant in (ACME, GLOBEX):
        record_ledger(cfg.table_store, tenant, REPLAYED, [t[2] for t in turns if t[0] == tenant and t[1] == REPLAYED], 1)
    labelled = dict(connect(cfg.lake).execute(
        "SELECT turn_id, bool_or(labelled) FROM rewards WHERE settled GROUP BY turn_id").fetchall())
    assert len(labelled) == len(turns)  # every turn settled
    assert {True, False} <= set(labelled.values())
    return cfg, turns, labelled


def allowed(history: list[tuple[datetime, bool]], when: datetime, default: bool, retroactive: bool) -> bool:
    """The rule (docs/privacy.md, Consent), written out: the latest record in effect at the turn's
    time (a tie: the opt-out), else the default; retroactive: no opt-out after it either."""
    before = [(t, c) for t, c in history if t <= when]
    if before:
        last = max(t for t, _ in before)
        state = all(c for t, c in before if t == last)
    else:
        state = default
    return state and not (retroactive and any(not c and t > when for t, c in history))


# A history: (minute, opt-in?) records; minutes are whole (exactly a turn's time) or half (between two).
record = st.tuples(st.integers(-2, 2 * MINUTES + 4).map(lambda h: h / 2), st.booleans())
histories = st.fixed_dictionaries({u: st.lists(record, max_size=3) for u in USERS})


NONE = {u: [] for u in USERS}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# an opt-in and an opt-out at one instant (the opt-out wins), exactly at a turn's time
@example(histories={**NONE, "alice": [(4.0, True), (4.0, False)], "bob": [(5.0, False)]}, default=True,
         retroactive=False, per_tenant=False)
# retroactive: an opt-out, then an opt-in, under an opt-in default per tenant
@example(histories={**NONE, "carol": [(10.0, False), (14.5, True)], "dave": [(3.0, True)]}, default=False,
         retroactive=True, per_tenant=True)
@given(histories=histories, default=st.booleans(), retroactive=st.booleans(), per_tenant=st.booleans())
def test_a_user_without_consent_at_a_turn_s_time_is_never_trained_on_or_replayed(lake, histories, default,
                                                                                   retroactive, per_tenant):
    base, turns, labelled = lake
    shutil.rmtree(base.lake / CONSENT, ignore_errors=True)  # this example's records only
    policy = {"consent_default": default, "consent_retroactive": retroactive}
    # the policy globally, or in acme's targets entry (globex then keeps the shipped defaults)
    cfg = TracerlConfig.from_dict({"home": str(base.home), **({"targets": {ACME: {"privacy": policy}}}
                                                              if per_tenant else {"privacy": policy})})
    for user, recs in histories.items():
        for m, consent in recs:
            # the same people are globex's users too: an acme record never touches globex
            record_consent(cfg, ACME, pseudonym(cfg, ACME, user), consent, "test", at=minute(m))
    got = {(tenant, task, labels): {t.turn_id for t in new_training_turns(cfg, tenant, task, 10_000, labelled=labels)}
           for tenant in (ACME, GLOBEX) for task in (FRESH, REPLAYED) for labels in (True, False)}
    pools = {tenant: {p.turn.turn_id for p in replay_pool(cfg, tenant, REPLAYED)} for tenant in (ACME, GLOBEX)}

    for tenant, task, tid, user, when, flag in turns:
        own = TracerlConfig.from_dict({}) if (tenant == GLOBEX and per_tenant) else None
        pol = (own.privacy.consent_default, own.privacy.consent_retroactive) if own else (default, retroactive)
        history = [(minute(m), c) for m, c in histories[user]] if (user and tenant == ACME) else []
        ok = flag and allowed(history, when, *pol)
        fresh = task == FRESH
        assert (tid in got[(tenant, task, True)]) is (ok and fresh and labelled[tid]), (tid, user, when, history, pol)
        assert (tid in got[(tenant, task, False)]) is (ok and fresh and not labelled[tid]), (tid, user, history, pol)
        assert (tid in pools[tenant]) is (ok and not fresh and labelled[tid]), (tid, user, when, history, pol)

    # every turn is still measured: settled in the rewards view, whatever its user's consent
    measured = {r[0] for r in connect(cfg.lake).execute("SELECT DISTINCT turn_id FROM rewards WHERE settled").fetchall()}
    assert measured == {t[2] for t in turns}


def test_an_opt_out_from_now_on_keeps_earlier_turns_unless_retroactive(lake):
    """The plain case, by wall clock: an opt-out recorded now (after every turn) excludes nothing
    landed before it; under a retroactive policy it takes all of the user's turns out."""
    base, turns, labelled = lake
    shutil.rmtree(base.lake / CONSENT, ignore_errors=True)
    record_consent(base, ACME, pseudonym(base, ACME, "alice"), False, "test", reason="asked by e-mail")
    alice = {t[2] for t in turns if t[0] == ACME and t[1] == FRESH and t[3] == "alice" and t[5] and labelled[t[2]]}
    assert alice and alice <= {t.turn_id for t in new_training_turns(base, ACME, FRESH, 10_000)}
    retro = TracerlConfig.from_dict({"home": str(base.home), "privacy": {"consent_retroactive": True}})
    assert not alice & {t.turn_id for t in new_training_turns(retro, ACME, FRESH, 10_000)}
    (rec,) = records(base, ACME)
    assert (rec.consent, rec.actor, rec.reason) == (False, "test", "asked by e-mail")


def test_a_record_never_holds_a_user_id_in_clear_and_refuses_bad_input(tmp_path):
    cfg = TracerlConfig(home=tmp_path / "home")
    user = pseudonym(cfg, ACME, "alice@example.com")
    for bad, match in (("alice@example.com", "not a pseudonym"), ("", "not a pseudonym"), (None, "not a pseudonym")):
        with pytest.raises(ConsentError, match=match):
            record_consent(cfg, ACME, bad, False, "test")
    with pytest.raises(ConsentError, match="tenant"):
        record_consent(cfg, "no such/tenant", user, False, "test")
    with pytest.raises(ConsentError, match="true .opt in. or false"):
        record_consent(cfg, ACME, user, "no", "test")
    with pytest.raises(ConsentError, match="actor must not be empty"):
        record_consent(cfg, ACME, user, False, " ")
    with pytest.raises(ConsentError, match="over the 1000-character limit"):
        record_consent(cfg, ACME, user, False, "test", reason="x" * 1001)
    with pytest.raises(ConsentError, match="time zone"):
        record_consent(cfg, ACME, user, False, "test", at=datetime(2026, 1, 1))
    assert records(cfg, ACME) == []  # nothing was written
    record_consent(cfg, ACME, user, False, "test")
    import duckdb

    con = duckdb.connect()
    stored = con.execute(f"SELECT * FROM {consent_source(con, cfg.table_store)}").fetchall()
    assert len(stored) == 1 and "alice" not in repr(stored) and user in repr(stored)


# -- the CLI --------------------------------------------------------------------------------------

@pytest.fixture
def cli(tmp_path, monkeypatch):
    """``tracerl --config <toml>`` for a home where tenant acme exists (its key file) and is retroactive."""
    toml = tmp_path / "tracerl.toml"
    toml.write_text(f'home = "{tmp_path / "home"}"\n[targets."acme".privacy]\nconsent_retroactive = true\n')
    monkeypatch.delenv("TRACERL_CONFIG", raising=False)
    keys = tmp_path / "home" / "gateway" / "keys"
    keys.mkdir(parents=True)
    (keys / "acme.key").write_text("tk-" + "a" * 40 + "\n")
    (keys / "acme.key").chmod(0o600)
    cfg = TracerlConfig(home=tmp_path / "home")

    def run(*argv: str) -> int:
        return main(["--config", str(toml), "consent", *argv])

    return run, cfg


def test_the_cli_records_and_shows_consent_by_pseudonym(cli, capsys):
    run, cfg = cli
    assert run("show", "--tenant", ACME, "--user", "alice") == 0
    out = capsys.readouterr().out
    alice = pseudonym(cfg, ACME, "alice")
    assert f"user {alice}: none recorded: trained on (the tenant's default)" in out
    assert "opt-outs are retroactive" in out
    assert run("set", "--tenant", ACME, "--user", "alice", "--opt-out", "--reason", "support ticket 12") == 0
    out = capsys.readouterr().out
    assert f"user {alice} opted out" in out and "retroactive" in out and "alice " not in out.replace(alice, "")
    assert run("set", "--tenant", ACME, "--user", "bob", "--opt-in", "--at", "2026-01-02T03:04:05Z", "--json") == 0
    assert '"effective_at": "2026-01-02T03:04:05.000000Z"' in capsys.readouterr().out
    assert run("show", "--tenant", ACME) == 0
    out = capsys.readouterr().out
    assert alice in out and pseudonym(cfg, ACME, "bob") in out and "support ticket 12" in out
    assert run("show", "--tenant", ACME, "--pseudonym", alice) == 0
    assert f"user {alice}: now opted out" in capsys.readouterr().out
    assert run("set", "--tenant", ACME, "--pseudonym", alice, "--opt-in") == 0
    capsys.readouterr()
    assert [r.consent for r in records(cfg, ACME, alice)] == [False, True]


def test_the_cli_refuses_bad_input_with_a_clear_error(cli, capsys):
    run, cfg = cli
    for argv, says in (
            (("set", "--tenant", "nobody", "--user", "alice", "--opt-out"), "unknown tenant 'nobody'"),
            (("show", "--tenant", "nobody"), "unknown tenant 'nobody'"),
            (("set", "--tenant", "bad/name", "--user", "alice", "--opt-out"), "tenant"),
            (("set", "--tenant", ACME, "--user", "", "--opt-out"), "--user '' must not be empty"),
            (("set", "--tenant", ACME, "--user", "x" * 257, "--opt-out"), "over the 256-character limit"),
            (("set", "--tenant", ACME, "--user", "al\nice", "--opt-out"), "control character U+000A"),
            (("set", "--tenant", ACME, "--pseudonym", "alice", "--opt-out"), "not a pseudonym"),
            (("set", "--tenant", ACME, "--user", "alice", "--opt-out", "--at", "yesterday"), "not an RFC 3339 time"),
            (("set", "--tenant", ACME, "--user", "alice", "--opt-out", "--at", "2026-01-02T03:04:05"), "no time zone"),
    ):
        assert run(*argv) == 1, argv
        err = capsys.readouterr().err
        assert says in err and err.startswith("tracerl consent: error:"), (argv, err)
    assert records(cfg, ACME) == []  # nothing recorded by any of them
    assert not (cfg.home / "privacy" / "secrets" / "nobody.key").exists()  # no secret made for a typo
    with pytest.raises(SystemExit):  # neither --opt-out nor --opt-in: argparse's usage error
        run("set", "--tenant", ACME, "--user", "alice")
    capsys.readouterr()
    assert run("show", "--tenant", ACME, "--user", "nobody-known") == 0  # an unknown user: an answer
    assert "none recorded" in capsys.readouterr().out
