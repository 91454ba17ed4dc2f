"""`tracerl`: the command line. Imports stay inside commands so `--help` is instant."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pipelines.config import TracerlConfig, load_config

from pipelines.stack import SERVE, SERVICES


def version() -> str:
    """tracerl's version: the installed package's metadata, else this checkout's pyproject.toml."""
    from importlib import metadata

    try:
        return metadata.version("tracerl")
    except metadata.PackageNotFoundError:
        import tomllib

        try:
            with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as fh:
                return tomllib.load(fh)["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def cmd_start(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines import stack

    for name in [s for s in SERVICES if s in args.services]:
        print(f"{name + ':':9} {stack.start(cfg, name)}", flush=True)
    return 0


def cmd_stop(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines import stack

    for name in [s for s in reversed(SERVICES) if s in args.services]:
        print(f"{name + ':':9} {'stopped' if stack.stop(cfg, name) else 'was not running'}")
    return 0


def cmd_status(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines import stack

    states = {name: stack.status(cfg, name) for name in SERVICES}
    for name, state in states.items():
        print(f"{name + ':':9} {state}")
    print(f"{'lake:':9} {cfg.lake.resolve()}")
    if cfg.tables.uri:
        print(f"{'tables:':9} {cfg.tables.uri} (events, quarantine, trained_turns)")
    print(f"{'store:':9} {cfg.tracking_uri}")
    if states["kafka"] == "stopped":  # embedded and not running: no lag to read (and no Kafka client to load)
        print(f"{'lag:':9} unknown (the embedded Kafka broker is not running: start it with `tracerl start kafka`)")
        return 0
    return _print_lag(cfg)


def _print_lag(cfg: TracerlConfig) -> int:
    """The lake's lag behind Kafka (pipelines/ingest/offsets.py); 1 when past its alarm bound."""
    from pipelines.ingest.offsets import IngestError, lake_lag

    try:
        lag = lake_lag(cfg).summary(cfg)
    except IngestError as e:
        print(f"{'lag:':9} unknown ({e})")
        return 0
    state = "ok" if lag["ok"] else f"RED: {lag['alarm']}"
    print(f"{'lag:':9} {lag['behind']} events in Kafka not in the lake, oldest {lag['oldest_age_s']:.0f} s ({state})")
    return 0 if lag["ok"] else 1


def cmd_serve(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    """vLLM + the gateway in the background (Kafka too, when embedded)."""
    return cmd_start(cfg, argparse.Namespace(services=list(SERVE)))


def cmd_up(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    """The whole local stack; the simulated tenant gets a key and a serving champion."""
    from pipelines.config import gate_config
    from pipelines.deploy.service import tenant_key
    from pipelines.loop.bootstrap import ensure_serving
    from pipelines.sim.evals import ensure_suite

    key = tenant_key(cfg, args.tenant)  # before the gateway starts: it reads the key files then
    cmd_start(cfg, argparse.Namespace(services=list(SERVICES)))
    version = ensure_serving(cfg, args.tenant, args.task)
    print(f"{args.tenant}/{args.task}: champion v{version} serving through the gateway "
          f"(API key in {cfg.home / 'gateway' / 'keys' / (args.tenant + '.key')}, {key[:6]}...)")
    # what the loop's gate decides on: the simulator's suite, unless one is there (as `make demo`: assets/demo.py)
    written = ensure_suite(gate_config(cfg.for_target(args.tenant, args.task)).suites_dir, args.tenant, args.task)
    if written is not None:
        print(f"{args.tenant}/{args.task}: the simulated users' private eval written to {written}/")
    print("Traffic: `tracerl simulate`; stack: `tracerl status`; stop: `tracerl down`")
    return 0


def cmd_down(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    return cmd_stop(cfg, argparse.Namespace(services=list(SERVICES)))


def cmd_simulate(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.deploy.service import read_gateway_state, tenant_key
    from pipelines.sim.env import HiddenPreference
    from pipelines.sim.traffic import TrafficConfig, simulate, summary

    gw = read_gateway_state(cfg)
    url = args.url or (gw.url if gw else None)
    if url is None:
        raise RuntimeError("no gateway: start the stack with `tracerl up`, or pass --url")
    t = TrafficConfig(tenant=args.tenant, task=args.task, requests=args.requests, users=args.users,
                      max_tokens=args.max_tokens, seed=args.seed)
    rounds = 0
    while True:
        rounds += 1
        stats = simulate(url, args.api_key or tenant_key(cfg, args.tenant), t,
                         HiddenPreference(max_tokens=args.preference_tokens))
        print(f"round {rounds}: {summary(stats)}", flush=True)
        for e in stats.errors[:3]:
            print(f"  error: {e}", file=sys.stderr)
        if not args.forever:
            return 1 if stats.failed == stats.requests else 0
        t = TrafficConfig(**{**t.__dict__, "seed": t.seed + 1})


def _shares(text: str) -> tuple[float, ...]:
    """argparse type of --bad-take-back: comma-separated numbers, each a share `check_take_back` accepts."""
    from pipelines.loop.backwards import check_take_back

    try:
        out = tuple(check_take_back(float(x)) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}; give comma-separated shares, e.g. 0.75,0.5,0.3") from None
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more comma-separated shares, e.g. 0.75,0.5,0.3")
    return out


def _operator_action(action: str, run) -> int:
    """Run an operator action (pipelines/deploy/operations.py); 2 = refused, 1 = the swap failed."""
    from pipelines.deploy.operations import Refused

    try:
        result = run()
    except Refused as e:
        print(f"tracerl {action}: refused: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=1, default=str))
    if not result.ok:
        print(f"tracerl {action}: the registry moved, but {result.summary()}; the next `deployment` run "
              f"retries", file=sys.stderr)
        return 1
    return 0


def cmd_deploy(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.deploy import operations

    return _operator_action("deploy", lambda: operations.deploy(cfg, args.tenant, args.task, args.version, args.who,
                                                                args.why, force=args.force))


def cmd_rollback(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.deploy import operations

    return _operator_action("rollback", lambda: operations.rollback(cfg, args.tenant, args.task, args.who, args.why))


def cmd_approve(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.deploy import operations

    return _operator_action("approve", lambda: operations.approve(cfg, args.tenant, args.task, args.version,
                                                                  args.who, args.why))


def cmd_reject(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.deploy import operations

    return _operator_action("reject", lambda: operations.reject(cfg, args.tenant, args.task, args.version,
                                                                args.who, args.why))


def _target_filter(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """--tenant / --task as given, each checked (a bad one is a one-line error echoing it bounded)."""
    from pipelines.adapters.store import check_id

    return (None if args.tenant is None else check_id(args.tenant, "tenant"),
            None if args.task is None else check_id(args.task, "task"))


def cmd_swaps(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from tracerl.tables import format_swaps, json_lines, swap_rows

    rows = swap_rows(cfg, *_target_filter(args), limit=args.limit)
    print(json_lines(rows) if args.json else format_swaps(rows))
    return 0


def cmd_canary(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    """Start, reshare, stop or list canaries on the running gateway; 1 = refused (nothing changed)."""
    from pipelines.deploy.service import GatewayError, canaries, canary

    try:
        if args.canary_command == "status":
            for c in canaries(cfg):
                print(json.dumps(c))
            return 0
        if args.canary_command == "check":
            from pipelines.canary.run import advance, advance_all

            if (args.tenant is None) != (args.task is None):
                print("tracerl canary check: give both TENANT and TASK, or neither (every canary)", file=sys.stderr)
                return 2
            steps = advance_all(cfg) if args.tenant is None else [advance(cfg, args.tenant, args.task)]
            for step in steps:
                print(step.line())
            return 1 if any(s.action == "failed" for s in steps) else 0
        fields = {"who": args.who, "why": args.why}
        if args.canary_command == "start":
            fields.update(version=args.version, share=args.share)
        elif args.canary_command == "share":
            fields.update(share=args.share)
        print(json.dumps(canary(cfg, args.canary_command, args.tenant, args.task, **fields), indent=1))
        return 0
    except GatewayError as e:
        print(f"tracerl canary {args.canary_command}: {e}", file=sys.stderr)
        return 1


def cmd_tenant_add(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.tenants import add_tenant

    r = add_tenant(cfg, args.name, args.task, serve=not args.no_serve)
    if r.key is not None:
        print(f"API key for {r.tenant} (shown once; stored 0600 in {r.key_file}):\n  {r.key}")
    else:
        print(f"{r.tenant}: key unchanged ({r.key_file or 'gateway.api_keys'})")
    for task, items in r.adopted.items():
        print(f"{r.tenant}/{task}: eval suite already written ({items} items in "
              f"{_suite_folder(cfg, r.tenant, task)}/): adopted as it is")
    for task, folder in r.suites.items():
        print(f"{r.tenant}/{task}: eval suite scaffolded in {folder}/ from the template; the gate will refuse "
              f"to promote on the template's placeholder items until they are replaced (see its README.md)")
    for task, version in r.served.items():
        print(f"{r.tenant}/{task}: champion v{version} (the base model) serving through the gateway")
    if r.serve_note:
        print(f"{r.tenant}: {r.serve_note}", file=sys.stderr if r.serve_failed else sys.stdout)
    return 1 if r.serve_failed else 0


def _suite_folder(cfg: TracerlConfig, tenant: str, task: str) -> Path:
    from pipelines.config import gate_config

    return Path(gate_config(cfg).suites_dir) / tenant / task


def cmd_tenant_list(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.tenants import list_tenants
    from tracerl.tables import format_tenants

    print(format_tenants(list_tenants(cfg)))
    return 0


def cmd_tenant_serve(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.tenants import serve_tenant

    for task, version in serve_tenant(cfg, args.name, args.task).items():
        print(f"{args.name}/{task}: champion v{version} serving through the gateway")
    return 0


def cmd_tenant_revoke(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.tenants import revoke_tenant

    print(f"{args.name}: key revoked ({revoke_tenant(cfg, args.name)} deleted); the gateway refuses it now")
    return 0


def _consent_user(cfg: TracerlConfig, args: argparse.Namespace) -> str | None:
    """The pseudonym ``tracerl consent`` acts on (--user in clear, or --pseudonym as stored), None
    for every user; refuses a tenant nothing knows and a user id the gateway would refuse."""
    from pipelines.contract.validate import short, user_problem
    from pipelines.lake.consent import ConsentError, check_pseudonym, tenants_with_data
    from pipelines.privacy.pseudonym import pseudonym
    from pipelines.tenants import check_name, tenant_names

    tenant = check_name(args.tenant, "tenant")
    known = tenant_names(cfg) | {k.partition("/")[0] for k in cfg.targets} | tenants_with_data(cfg.table_store)
    if tenant not in known:
        raise ConsentError(f"unknown tenant {tenant!r}: no API key, eval suite, adapters, route, targets entry or "
                           f"landed events; check the name (`tracerl tenant list`)")
    if args.pseudonym is not None:
        return check_pseudonym(args.pseudonym)
    if args.user is None:
        return None
    why = "must not be empty" if not args.user else user_problem(args.user)
    if why:
        raise ConsentError(f"--user {short(args.user)} {why}")
    return pseudonym(cfg, tenant, args.user)


def cmd_consent_set(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    import getpass

    from datetime import datetime

    from pipelines.lake.consent import ConsentError, policy, record_consent

    user = _consent_user(cfg, args)
    at = None
    if args.at is not None:
        try:
            at = datetime.fromisoformat(args.at)
        except ValueError:
            raise ConsentError(f"--at {args.at!r} is not an RFC 3339 time, e.g. 2026-12-07T10:00:00Z") from None
        if at.tzinfo is None:
            raise ConsentError(f"--at {args.at!r} has no time zone: add 'Z' or an offset")
    try:
        actor = args.actor or f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (a container): say where it came from at least
        actor = "cli"
    rec = record_consent(cfg, args.tenant, user, args.consent, actor, args.reason, at=at)
    pol = policy(cfg, args.tenant)
    if rec.consent:
        what = "opted in: their turns from then on may be trained on"
    elif pol.retroactive:
        what = "opted out: none of their turns is trained on or replayed from now on (retroactive: earlier ones too)"
    else:
        what = "opted out: their turns from then on are never trained on or replayed"
    print(json.dumps(rec.to_dict()) if args.json else
          f"{rec.tenant}: user {rec.user_id} {what} (effective {rec.to_dict()['effective_at']}, by {rec.actor})")
    return 0


def cmd_consent_show(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.lake.consent import latest, policy, records

    user = _consent_user(cfg, args)
    pol = policy(cfg, args.tenant)
    default = "trained on" if pol.default else "not trained on"
    recs = records(cfg, args.tenant, user)
    shown = recs if user is not None else sorted(latest(recs).values(), key=lambda r: r.user_id)
    if args.json:
        for r in shown:
            print(json.dumps(r.to_dict()))
        if user is not None and not recs:
            print(json.dumps({"tenant": args.tenant, "user": user, "consent": None, "default": pol.default}))
        return 0
    print(f"{args.tenant}: users with no record are {default} (privacy.consent_default = "
          f"{str(pol.default).lower()}); opt-outs {'are' if pol.retroactive else 'are not'} retroactive "
          f"(privacy.consent_retroactive)")
    if not shown:
        print(f"user {user}: none recorded: {default} (the tenant's default)" if user is not None else
              "no consent records")
        return 0
    from tracerl.tables import format_consent

    print(format_consent(shown))
    if user is not None:
        now = latest(recs).get(user)
        print(f"user {user}: now " + (("opted in" if now.consent else "opted out") if now else
                                      f"as the default ({default}): no record in effect yet"))
    return 0


def cmd_produce_sample(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.ingest.producer import TraceProducer
    from pipelines.ingest.sample import bad_messages, generate

    events = generate(args.traces, seed=args.seed)
    with TraceProducer(cfg) as producer:
        for e in events:
            producer.send(e)
        bad = bad_messages(cfg.ingest.max_event_bytes) if args.bad else []
        for reason, raw in bad:
            producer.send_raw(b"bad-sample", raw, reason)
    print(f"produced {len(events)} events from {args.traces} traces and {len(bad)} bad messages "
          f"to {cfg.kafka.topic}")
    return 0


def cmd_ingest(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.ingest.run import run_ingest

    r = run_ingest(cfg, max_events=args.max_events, group_id=args.group, topic=args.topic)
    print(json.dumps({**r.__dict__, "quarantine_rate": round(r.quarantine_rate, 4)}, indent=1, default=str))
    return 0


def cmd_lake_vacuum(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.lake import delta

    for dataset in delta.PARTITIONS:
        print(f"{dataset}: {len(delta.vacuum(cfg.table_store, dataset, args.hours))} orphan files deleted")
    return 0


def cmd_retention_apply(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from datetime import datetime

    from pipelines.rights.retention import apply_retention

    now = datetime.fromisoformat(args.now) if args.now else None
    if now is not None and now.tzinfo is None:
        raise ValueError(f"--now {args.now!r} has no time zone: add 'Z' or an offset")
    report = apply_retention(cfg, now=now, dry_run=args.dry_run)
    print(json.dumps(report.to_dict(), indent=1) if args.json else "\n".join(report.lines()))
    return 0


def cmd_lake_migrate(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.lake.migrate import migrate

    print(migrate(cfg.lake).line())
    return 0


def cmd_sql(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.lake.query import connect

    con = connect(cfg.lake, cfg.table_store)
    rel = con.sql(args.query)
    if rel is not None:
        if args.format == "json":
            print(json.dumps(rel.fetch_arrow_table().to_pylist(), default=str, indent=1))
        else:
            rel.show(max_rows=args.max_rows, max_width=200)
    return 0


def cmd_reward(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from datetime import datetime

    from pipelines.reward.engine import run_rewards
    from pipelines.reward.spec import load_spec_book, reward_spec_book

    now = datetime.fromisoformat(args.now) if args.now else None
    book = load_spec_book(args.spec) if args.spec else reward_spec_book(cfg)  # as the turn_rewards asset
    r = run_rewards(cfg.lake, book=book, now=now, tables=cfg.table_store)
    print(f"reward run {r.run_id}: {r.new_signals} new signals, {r.settled} turns settled "
          f"({r.settled_unlabelled} unlabelled), {r.provisional} provisional, corrections {r.corrections}")
    return 0


def cmd_train(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.train.run import run_learner, training_targets

    targets = [(args.tenant, args.task)] if args.tenant and args.task else training_targets(cfg)
    for tenant, task in targets:
        r = run_learner(cfg, tenant, task)
        detail = (f"adapter v{r.adapter_version} from {r.parent_version or 'a fresh adapter'}, "
                  f"{r.new_turns} turns, MLflow run {r.mlflow_run_id}") if r.status == "trained" else r.reason
        print(f"{tenant}/{task}: {r.status}: {detail}")
    return 0


def cmd_forget(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    """`tracerl forget`: one end user's data out of every store, the adapters trained on them marked;
    the receipt printed (and appended to <home>/privacy/forget/receipts.jsonl). docs/privacy.md#forget."""
    import json

    from pipelines.rights.forget import ForgetError, ForgetRefused, forget

    try:
        receipt = forget(cfg, args.tenant, args.user, args.actor)
    except (ForgetError, ForgetRefused) as err:
        print(f"tracerl forget: {err}", file=sys.stderr)
        return 2
    print(json.dumps(receipt.to_dict(), indent=1) if args.json else "\n".join(receipt.lines()))
    return 0


def cmd_adapters(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from tracerl.tables import adapter_rows, format_adapters, json_lines

    rows = adapter_rows(cfg, *_target_filter(args))
    print(json_lines(rows) if args.json else format_adapters(rows))
    return 0


def cmd_schema(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    from pipelines.contract import jsonschema

    if args.write:
        print(f"wrote {jsonschema.write()}")
    else:
        sys.stdout.write(jsonschema.render())
    return 0


def cmd_demo(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    if args.canary:
        from assets.canary_demo import main

        return main(cfg, iterations=args.iterations, fresh=args.fresh, keep=args.keep, take_back=args.bad_take_back)
    from assets.demo import main as loop_demo  # drives the Dagster job, so it lives beside the assets

    return loop_demo(cfg, iterations=args.iterations, fresh=args.fresh, keep=args.keep)


def cmd_gate(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    """Gate one candidate now; 0 when the gate decided (whatever it decided), 1 on an error."""
    from pipelines.gate.run import gate_version

    try:
        summary = gate_version(cfg, args.tenant, args.task, args.version, who=args.who)
    except LookupError as e:
        print(f"tracerl gate: {e.args[0]}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1, default=str))
    print(f"{args.tenant}/{args.task} v{summary['registry_version']}: {summary['outcome']}; "
          f"serving adapter v{summary['serving']}", file=sys.stderr)
    return 1 if summary["outcome"] == "error" else 0


def cmd_loop(cfg: TracerlConfig, args: argparse.Namespace) -> int:
    """One iteration of the closed-loop job for one target, in this process; 0 if the run completed
    (whatever the gate decided), 1 if it failed, 2 if refused (the target has an iteration going)."""
    from assets.driver import LoopBusy, check_resource, describe, run_iteration
    from assets.resources import TracerlResource

    resource = TracerlResource(config_path=os.environ.get("TRACERL_CONFIG"), home=str(cfg.home))
    check_resource(resource, cfg)
    try:
        run = run_iteration(resource, args.tenant, args.task, tags={"tracerl/driver": "cli"})
    except LoopBusy as e:
        print(f"tracerl loop: refused: {e}", file=sys.stderr)
        return 2
    print("\n".join(describe(run, cfg)))
    return 0 if run.success else 1


# what `tracerl sql` can read (the lake's DuckDB views; tests/test_cli.py checks it against them)
SQL_VIEWS = ("events", "turns", "tool_calls", "feedback", "session_ends", "quarantine", "rewards",
             "reward_corrections")


class _Version(argparse.Action):
    """``--version``: read when asked (``version()``), not each time the parser is built."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"tracerl {version()}")  # to stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tracerl", description=(
        "Own and keep improving your model from your own production traffic. "
        "Settings: tracerl.toml, TRACERL_HOME, TRACERL_KAFKA_BOOTSTRAP, TRACERL_LAKE."))
    p.add_argument("--config", help="path to tracerl.toml (default: $TRACERL_CONFIG or ./tracerl.toml)")
    p.add_argument("--version", action=_Version, help="print tracerl's version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("up", help="start the local stack: Kafka, MLflow, vLLM, gateway, Dagster; print the ports")
    s.add_argument("--tenant", default="acme", help="tenant to serve at once (default acme)")
    s.add_argument("--task", default="concise", help="its task (default concise, the simulator's)")
    s.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop every service tracerl started (and nothing else)").set_defaults(fn=cmd_down)
    s = sub.add_parser("start", help="start embedded services one by one")
    s.add_argument("services", nargs="*", default=list(SERVICES), metavar="SERVICE",
                   help=f"which: {', '.join(SERVICES)} (default: all)")
    s.set_defaults(fn=cmd_start)
    s = sub.add_parser("stop", help="stop the embedded services tracerl started")
    s.add_argument("services", nargs="*", default=list(SERVICES), metavar="SERVICE",
                   help=f"which: {', '.join(SERVICES)} (default: all)")
    s.set_defaults(fn=cmd_stop)
    sub.add_parser("status", help="show embedded services, the lake and MLflow").set_defaults(fn=cmd_status)
    sub.add_parser("serve", help="start vLLM (LoRA, runtime updates) and the gateway in front of it"
                   ).set_defaults(fn=cmd_serve)

    # operator actions: move the registry's `champion` (what serves) with who and why, then reconcile
    who = {"default": os.environ.get("USER", "cli"), "help": "who acts (recorded on the model versions)"}
    s = sub.add_parser("deploy", help="make adapter VERSION the champion and serve it (refuses a gate-rejected "
                                      "version without --force)")
    s.add_argument("tenant")
    s.add_argument("task")
    s.add_argument("version", type=int, help="adapter version (as `tracerl adapters` lists it)")
    s.add_argument("--who", **who)
    s.add_argument("--why", required=True, help="why (recorded on the model versions)")
    s.add_argument("--force", action="store_true", help="serve a version the gate or a reviewer rejected; "
                                                        "recorded as a forced override")
    s.set_defaults(fn=cmd_deploy)
    s = sub.add_parser("rollback", help="the champion back to the version it replaced, served at once")
    s.add_argument("tenant")
    s.add_argument("task")
    s.add_argument("--who", **who)
    s.add_argument("--why", required=True, help="why (recorded on both model versions)")
    s.set_defaults(fn=cmd_rollback)
    for name, fn, what in (("approve", cmd_approve, "a held challenger (review mode) becomes champion and serves"),
                           ("reject", cmd_reject, "a held challenger (review mode) is rejected")):
        s = sub.add_parser(name, help=what)
        s.add_argument("tenant")
        s.add_argument("task")
        s.add_argument("version", type=int, help="adapter version (as `tracerl adapters` lists it)")
        s.add_argument("--who", **who)
        s.add_argument("--why", required=True, help="why (recorded on the model version)")
        s.set_defaults(fn=fn)
    s = sub.add_parser("gate", help="gate one candidate against the champion on the private evals now; "
                                    "a promotion serves at once")
    s.add_argument("--tenant", required=True)
    s.add_argument("--task", required=True)
    s.add_argument("--version", type=int, help="adapter version (default: the newest not yet gated)")
    s.add_argument("--who", **who)
    s.set_defaults(fn=cmd_gate)
    s = sub.add_parser("canary", help="try a version on a share of live conversations beside the champion")
    csub = s.add_subparsers(dest="canary_command", required=True, metavar="ACTION")
    c = csub.add_parser("start", help="adapter VERSION serves --share of the conversations (sticky), beside the champion")
    c.add_argument("tenant")
    c.add_argument("task")
    c.add_argument("version", type=int, help="adapter version (as `tracerl adapters` lists it)")
    c.add_argument("--share", type=float, help="share of conversations in (0, 1) (default: canary.share, 0.1)")
    c.add_argument("--why", required=True, help="why (recorded in the swap log)")
    c = csub.add_parser("share", help="change a running canary's share (conversations already served keep their side)")
    c.add_argument("tenant")
    c.add_argument("task")
    c.add_argument("share", type=float, help="new share in (0, 1)")
    c.add_argument("--why", help="why (recorded in the swap log)")
    c = csub.add_parser("stop", help="all traffic back to the champion; the challenger is unloaded once idle")
    c.add_argument("tenant")
    c.add_argument("task")
    c.add_argument("--why", required=True, help="why (recorded in the swap log)")
    for c in csub.choices.values():
        c.add_argument("--who", **who)
        c.set_defaults(fn=cmd_canary)
    csub.add_parser("status", help="every running canary: versions, share, requests in flight per side"
                    ).set_defaults(fn=cmd_canary)
    c = csub.add_parser("check", help="decide now from settled sessions: promote, roll back, expire or go on "
                                      "(what the canary_settling sensor runs)")
    c.add_argument("tenant", nargs="?")
    c.add_argument("task", nargs="?")
    c.set_defaults(fn=cmd_canary)
    s = sub.add_parser("swaps", help="every swap and canary start/stop: when, target, from, to, outcome, requests")
    s.add_argument("--tenant", help="only this tenant's")
    s.add_argument("--task", help="only this task's")
    s.add_argument("--limit", type=int, help="the last N (after filtering)")
    s.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    s.set_defaults(fn=cmd_swaps)

    s = sub.add_parser("tenant", help="add, list, serve or revoke tenants (API key, champion, eval suite)")
    tsub = s.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")
    t = tsub.add_parser("add", help="a new tenant (or new tasks of one): API key, first champion, eval suite")
    t.add_argument("name", help="tenant id ([A-Za-z0-9][A-Za-z0-9._-], 64 at most)")
    t.add_argument("--task", action="append", required=True, help="a task id (repeat for several)")
    t.add_argument("--no-serve", action="store_true", help="do not serve a first champion now")
    t.set_defaults(fn=cmd_tenant_add)
    tsub.add_parser("list", help="tenants, tasks, champion and serving versions, keys, eval suites"
                    ).set_defaults(fn=cmd_tenant_list)
    t = tsub.add_parser("serve", help="serve each task's champion (the base model at first) through the gateway")
    t.add_argument("name")
    t.add_argument("--task", action="append", help="only these tasks (default: all of the tenant's)")
    t.set_defaults(fn=cmd_tenant_serve)
    t = tsub.add_parser("revoke", help="delete the tenant's key file: the running gateway refuses the key at once")
    t.add_argument("name")
    t.set_defaults(fn=cmd_tenant_revoke)

    s = sub.add_parser("consent", help="end users' consent to be trained on, per tenant (docs/privacy.md)")
    csub = s.add_subparsers(dest="consent_command", required=True, metavar="ACTION")
    for name, what in (("set", "record a user's opt-out or opt-in; the learner applies it from its next selection"),
                       ("show", "the tenant's consent policy and records (each user's in force, or one user's history)")):
        c = csub.add_parser(name, help=what)
        c.add_argument("--tenant", required=True)
        who = c.add_mutually_exclusive_group(required=name == "set")
        who.add_argument("--user", help="the app's user id, in clear (the OpenAI `user` field): pseudonymized with "
                                        "the tenant's secret, never stored")
        who.add_argument("--pseudonym", help="the user as the lake and `consent show` name them (u_ + 32 hex)")
        c.add_argument("--json", action="store_true", help="one JSON object per line")
        if name == "set":
            way = c.add_mutually_exclusive_group(required=True)
            way.add_argument("--opt-out", dest="consent", action="store_false", help="never train on the user")
            way.add_argument("--opt-in", dest="consent", action="store_true", help="the user may be trained on")
            c.add_argument("--reason", help="why (kept with the record; never the user's id in clear)")
            c.add_argument("--at", help="RFC 3339 time it takes effect (default now), e.g. when the user "
                                        "opted out in the app")
            c.add_argument("--actor", help="who records it (default cli:<your OS user>)")
        c.set_defaults(fn=cmd_consent_set if name == "set" else cmd_consent_show)

    s = sub.add_parser("produce-sample", help="produce realistic sample traces from simulated apps")
    s.add_argument("--traces", type=int, default=200, help="number of traces (default 200)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--bad", action="store_true", help="also produce one bad message of each quarantine class")
    s.set_defaults(fn=cmd_produce_sample)

    s = sub.add_parser("ingest", help="land one bounded batch from Kafka into the lake, exactly once")
    s.add_argument("--max-events", type=int, help="events this run (default: ingest.max_events)")
    s.add_argument("--group", help="the consumer group the landed offsets are committed to, for lag tools "
                   "(default: kafka.group_id); ingest never joins it")
    s.add_argument("--topic", help="topic (default: kafka.topic)")
    s.set_defaults(fn=cmd_ingest)

    s = sub.add_parser("lake", help="lake maintenance")
    lsub = s.add_subparsers(dest="lake_command", required=True)
    lsub.add_parser("migrate", help="move a lake of the layout before Delta Lake (events, quarantine, ledger, "
                    "references) onto Delta tables, in place; safe to run again").set_defaults(fn=cmd_lake_migrate)
    v = lsub.add_parser("vacuum", help="delete data files no commit names (left by writers killed mid-write)")
    v.add_argument("--hours", type=int, default=24, help="only files older than this (default 24: keeps a "
                   "commit in flight)")
    v.set_defaults(fn=cmd_lake_vacuum)

    s = sub.add_parser("retention", help="delete each tenant's traffic past its retention period "
                                         "(privacy.retention_days) from every store")
    rsub = s.add_subparsers(dest="retention_command", required=True, metavar="ACTION")
    r = rsub.add_parser("apply", help="delete now what the daily retention_daily schedule would: lake rows, "
                                      "gateway journal and spill segments, review tables; print the report")
    r.add_argument("--dry-run", action="store_true", help="count what would go, delete nothing")
    r.add_argument("--now", help="ISO 8601 time the periods count back from (default: the clock)")
    r.add_argument("--json", action="store_true", help="the report as JSON")
    r.set_defaults(fn=cmd_retention_apply)

    s = sub.add_parser("forget", help="delete one end user's data from every store, mark the adapter versions "
                                      "trained on them, print the receipt (docs/privacy.md#forget)")
    s.add_argument("--tenant", required=True)
    s.add_argument("--user", required=True, help="the user id the app sends (OpenAI `user`); never stored")
    s.add_argument("--actor", default=None, help="who asked (recorded on the receipt; default: the OS user)")
    s.add_argument("--json", action="store_true", help="the receipt as JSON")
    s.set_defaults(fn=cmd_forget)

    s = sub.add_parser("sql", help=f"query the lake with DuckDB (views: {', '.join(SQL_VIEWS)})",
                       description=f"Query the lake with DuckDB. Views: {', '.join(SQL_VIEWS)}.")
    s.add_argument("query", help="one SQL statement over the views, e.g. \"SELECT count(*) FROM turns\"")
    s.add_argument("--format", choices=["table", "json"], default="table")
    s.add_argument("--max-rows", type=int, default=40)
    s.set_defaults(fn=cmd_sql)

    s = sub.add_parser("reward", help="turn new lake events into per-turn rewards (incremental)")
    s.add_argument("--spec", help="one reward spec TOML for every tenant, this run only (default: the "
                                  "configuration's reward.spec, as Dagster's turn_rewards; docs/configuration.md)")
    s.add_argument("--now", help="ISO 8601 event-time 'now' for settling (default: wall clock)")
    s.set_defaults(fn=cmd_reward)

    s = sub.add_parser("train", help="one learner iteration: a candidate adapter from new settled turns")
    s.add_argument("--tenant")
    s.add_argument("--task")
    s.set_defaults(fn=cmd_train)

    s = sub.add_parser("adapters", help="adapter versions of every tenant/task (or the ones named), marked live / "
                                        "canary / champion / challenger / rejected")
    s.add_argument("--tenant", help="only this tenant's")
    s.add_argument("--task", help="only this task's")
    s.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    s.set_defaults(fn=cmd_adapters)

    s = sub.add_parser("schema", help="print the trace-event JSON Schema")
    s.add_argument("--write", action="store_true", help="rewrite the shipped schema file")
    s.set_defaults(fn=cmd_schema)

    s = sub.add_parser("simulate", help="simulated users chat through the gateway and give feedback "
                                        "by a hidden preference")
    s.add_argument("--tenant", default="acme")
    s.add_argument("--task", default="concise")
    s.add_argument("--requests", type=int, default=64, help="requests per round (default 64)")
    s.add_argument("--users", type=int, default=8, help="concurrent users (default 8)")
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--preference-tokens", type=int, default=40,
                   help="users like a complete reply ending in '.' within this many tokens (default 40)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--forever", action="store_true", help="keep sending rounds until interrupted")
    s.add_argument("--url", help="gateway URL (default: the one tracerl started)")
    s.add_argument("--api-key", help="tenant API key (default: <home>/gateway/keys/<tenant>.key)")
    s.set_defaults(fn=cmd_simulate)

    s = sub.add_parser("demo", help="the closed loop on SmolLM2: traffic, ingest, rewards, train, gate, "
                                    "hot swap, K times; then a report and plots")
    s.add_argument("--iterations", type=int, default=3)
    s.add_argument("--fresh", action="store_true", help="clear the loop's state first (lake, adapters, MLflow)")
    s.add_argument("--keep", action="store_true", help="leave Kafka, vLLM and the gateway running")
    s.add_argument("--canary", action="store_true",
                   help="the canary's demo instead: a good candidate promoted through a canary, a deliberately "
                        "bad one (an update applied backwards) rolled back by it; --iterations bounds the loop "
                        "iterations spent finding the good one")
    s.add_argument("--bad-take-back", type=_shares, default=None, metavar="K[,K...]",
                   help="with --canary: shares of the good candidate's update the bad one takes back, tried in "
                        "order until the offline gate cannot call one worse than the champion (default "
                        "0.75,0.5,0.3; 2 reverses the whole update, 1.5 half of it)")
    s.set_defaults(fn=cmd_demo)
    s = sub.add_parser("loop", help="one iteration of the closed-loop Dagster job for one tenant/task, "
                                    "in this process (DAGSTER_HOME); prints the candidate, the gate's decision "
                                    "and what serves")
    s.add_argument("--tenant", required=True)
    s.add_argument("--task", required=True)
    s.set_defaults(fn=cmd_loop)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = set(getattr(args, "services", [])) - set(SERVICES)
    if unknown:
        parser.error(f"unknown service(s) {sorted(unknown)}; known: {', '.join(SERVICES)}")
    cfg = load_config(args.config)
    source = Path(args.config or os.environ.get("TRACERL_CONFIG") or "tracerl.toml")
    if source.is_file():  # the services this command starts (gateway, Dagster) read the same file
        os.environ["TRACERL_CONFIG"] = str(source.resolve())
    try:
        return args.fn(cfg, args)
    except Exception as e:  # a clean one-line error for known failures; tracebacks with TRACERL_DEBUG
        if os.environ.get("TRACERL_DEBUG"):
            raise
        print(f"tracerl {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
