"""The expiry command: parse, open the App, call the library, print.

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad config. Errors are one
line on stderr; --debug shows the traceback. Every option that takes a value
also reads an EXPIRY_* environment variable (see --help).

One ``cmd_*`` function per command, over the services (Cleanup, Runs, Queue,
the App's worker and scheduler); what each command accepts is in cli/args.py,
how it prints in cli/output.py. A command that only reads opens the App with
``reading`` (read_only: it creates and alters nothing, not even an SQLite
file); one that writes opens it with ``migrated``. The HTTP stack (FastAPI,
uvicorn) is imported inside `expiry serve` only: it is most of a command's
start-up time otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import start_http_server

from .. import defaults, signals, status
from .. import log as logconfig
from ..app import App
from ..cleanup.preview import PlanPreview
from ..cleanup.service import Cleanup
from ..config import check_listen, config_path
from ..errors import ConfigError, ExpiryError, MigrationError, SchemaError
from ..queue.jobs import policy_queue
from ..times import format_time, parse_duration, parse_time
from ..times import parse_since as since_of
from .args import (
    Parser,
    common,
    demo_args,
    dlq_args,
    evidence_args,
    keys_args,
    no_args,
    plan_args,
    policy_args,
    runs_args,
    serve_args,
    stop_args,
    trigger_args,
    worker_args,
)
from .demo import run_demo
from .output import (
    emit,
    out,
    print_check,
    print_dead_jobs,
    print_evidence,
    print_json,
    print_preview,
    print_run,
    print_runs,
    print_status,
    wait_with_progress,
    write_evidence_csv,
)

if TYPE_CHECKING:
    from ..queue.jobs import Queue

logger = logging.getLogger("expiry.cli")

Command = Callable[[argparse.Namespace], int]
Arguments = Callable[[argparse.ArgumentParser], None]


# -- the parser ---------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="expiry", description="Durable, idempotent retention cleanup.", parents=[common()]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The common options after the command: without a default of their own, or
    # the subparser would overwrite `expiry --config X cmd` with its default.
    after = common()
    for action in after._actions:
        action.default = argparse.SUPPRESS
    for name, fn, text, arguments in commands():
        command = sub.add_parser(name, parents=[after], help=text, description=text)
        command.set_defaults(fn=fn)
        arguments(command)
    return parser


def commands() -> list[tuple[str, Command, str, Arguments]]:
    """Every command, in the order --help lists them: name, function, help, arguments."""
    return [
        ("demo", cmd_demo, "build a sample SQLite marketplace and clean it, with a report", demo_args),
        ("migrate", cmd_migrate, "create or upgrade expiry's own tables", no_args),
        ("check", cmd_check, "validate expiry.toml and every policy against the live schema", no_args),
        ("worker", cmd_worker, "run jobs", worker_args),
        ("trigger", cmd_trigger, "start a run now (idempotent for the same cutoff)", trigger_args),
        ("plan", cmd_plan, "dry-run: cutoff, candidate rows and windows; mutates nothing", plan_args),
        ("status", cmd_status, "policies, watermarks, queue and DLQ at a glance", no_args),
        ("scheduler", cmd_scheduler, "fire cron schedules only", stop_args),
        ("serve", cmd_serve, "scheduler, workers and the HTTP API in one process", serve_args),
        ("pause", cmd_pause, "pause a policy's schedule", policy_args),
        ("resume", cmd_resume, "resume a policy's schedule", policy_args),
        (
            "keys",
            cmd_keys,
            "API keys: create NAME [--scope S]..., list, scope NAME --scope S..., revoke NAME",
            keys_args,
        ),
        ("runs", cmd_runs, "recent runs, `runs show RUN_ID`, `runs cancel RUN_ID`", runs_args),
        ("dlq", cmd_dlq, "dead-letter review: list, show KEY, redrive, discard", dlq_args),
        ("evidence", cmd_evidence, "what a policy's runs deleted or archived, from the ledger", evidence_args),
    ]  # fmt: skip


# -- opening the App --------------------------------------------------------------


def open_app(
    args: argparse.Namespace, *, need_config: bool = False, read_only: bool = False
) -> App:
    if args.database_url:
        os.environ["EXPIRY_DATABASE_URL"] = args.database_url
    path = config_path(Path(args.config) if args.config else None)
    if path.exists():
        return App.from_config(path, read_only=read_only)
    if need_config or not args.database_url:
        raise ConfigError(f"no config file at {path}: pass --config PATH or set EXPIRY_CONFIG")
    return App(args.database_url, read_only=read_only)


def migrated(args: argparse.Namespace, *, need_config: bool = False) -> App:
    """``open_app`` for a command that writes: expiry's own tables created or
    upgraded first."""
    app = open_app(args, need_config=need_config)
    app.migrate()
    return app


def reading(args: argparse.Namespace, *, need_config: bool = False) -> App:
    """``open_app`` for a command that only reads (check, plan, evidence, trigger
    --dry-run, status, runs, runs show, dlq list and show, keys list): it
    creates and alters nothing, an SQLite file included; where expiry's own
    tables are not there yet, reading them raises MigrationError (exit 2)
    saying to run `expiry migrate`."""
    return open_app(args, need_config=need_config, read_only=True)


def load_app(spec: str) -> App:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--app {spec!r}: write MODULE:ATTR, e.g. myapp.cleanup:app")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"--app {spec!r}: {module_name}.{attr} is not an expiry App")
    return app


def cleanup_of(app: App) -> Cleanup:
    """The App's policies; an App opened with ``need_config`` always has them."""
    if app.cleanup is None:
        raise ConfigError("no policies: this command needs a config file (--config PATH)")
    return app.cleanup


def log_warnings(app: App) -> None:
    """Check every policy against the live schema before running: one that
    fits with doubts is logged; one that does not fit is quarantined (logged
    as an error, checked again on its next use) and the others run."""
    if app.cleanup is not None:
        warnings, _ = app.cleanup.check_all()  # each quarantine is logged once
        for warning in warnings:
            logger.warning(warning)


def parse_cutoff(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError:
        raise ConfigError(f"--cutoff {text!r} is not ISO-8601, e.g. 2026-11-30T00:00:00Z") from None


# -- commands: setting up and running ---------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    report = run_demo(Path(args.path), rows=args.rows, workers=args.workers, show=not args.json)
    emit(args, report, lambda: None)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    app = open_app(args)
    applied = app.migrate()
    version = app.engine.schema_version()
    emit(
        args,
        {"applied": applied, "version": version},
        lambda: out.print(f"applied {applied or 'nothing'}; schema version {version}"),
    )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """The policies against the application's tables and the catalog, which
    needs none of expiry's own; then exit 2 when those are not there yet (or
    not at this expiry's version), saying to run `expiry migrate`."""
    app = reading(args, need_config=True)
    cleanup = app.table_reader()
    current, latest = app.schema_versions()
    warnings = cleanup.check()
    names = [p.name for p in cleanup.policies]
    timestamps = {p.name: cleanup.target(p.name).reading for p in cleanup.policies}
    notes = {p.name: cleanup.target(p.name).notes for p in cleanup.policies}
    emit(
        args,
        {
            "ok": current == latest,
            "policies": names,
            "warnings": warnings,
            "timestamps": timestamps,
            "notes": notes,
            "schema": {"version": current, "needs": latest},
        },
        lambda: print_check(warnings, timestamps, notes, len(names), (current, latest)),
    )
    problem = app.schema_problem()
    if problem is not None:
        raise problem
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    listen = (
        checked_listen(args.metrics_listen, "--metrics-listen") if args.metrics_listen else None
    )
    app = load_app(args.app) if args.app else open_app(args)
    app.migrate()
    log_warnings(app)
    if listen is not None:
        serve_process_metrics(listen)
    settings = app.config.worker if app.config is not None else None
    worker = app.worker(
        concurrency=args.concurrency or (settings.concurrency if settings else 1),
        queues=tuple(args.queue or ()),
        lease=settings.lease if settings else defaults.LEASE_SECONDS,
        batch=settings.claim_batch if settings else defaults.CLAIM_BATCH,
        prune_after=settings.prune_after if settings else defaults.PRUNE_AFTER_SECONDS,
        ack_delay=settings.ack_delay if settings else defaults.ACK_DELAY_SECONDS,
        until_idle=args.until_idle,
    )
    with signals.listening(reload=app.reload):
        code = worker.run()
    if code == 0 and args.until_idle:
        return idle_exit(app, worker.queues)
    return code


def idle_exit(app: App, queues: Sequence[str]) -> int:
    """`worker --until-idle` stops when nothing is due; it exits 3, not 0, when
    jobs still wait for a retry, or a policy's jobs wait snoozed (a run waiting
    for an earlier one, a quarantined policy), so that a cron line notices the
    work is not done."""
    by_state = app.queue.stats().by_state
    retrying = sum(by_state.get(q, {}).get("retryable", 0) for q in queues)
    snoozed = sum(
        by_state.get(q, {}).get("scheduled", 0) for q in queues if q.startswith(policy_queue(""))
    )
    if retrying or snoozed:
        logger.warning(
            "idle, but %d jobs wait for a retry and %d of the policies' jobs are snoozed: "
            "exit 3 (run the worker again later, or without --until-idle; `expiry status` "
            "says why they wait)",
            retrying,
            snoozed,
        )
        return 3
    return 0


def cmd_scheduler(args: argparse.Namespace) -> int:
    app = migrated(args, need_config=True)
    log_warnings(app)
    return app.scheduler().run()


def cmd_serve(args: argparse.Namespace) -> int:
    """The HTTP API, the scheduler and the workers, each in a thread of its
    own; the main thread hears the signals (run_command), the three stop on the first
    SIGTERM or SIGINT, and the server's end (a signal's, or its failure) ends
    the other two. uvicorn runs off the main thread, so it installs no signal
    handlers of its own: a second signal exits at once, as in a worker."""
    app = migrated(args, need_config=True)
    log_warnings(app)
    config = app.config
    assert config is not None  # need_config: opened from a config file
    listen = checked_listen(args.listen or config.http.listen)
    scheduler = app.scheduler()
    worker = app.worker(
        concurrency=args.concurrency or config.worker.concurrency,
        lease=config.worker.lease,
        batch=config.worker.claim_batch,
        prune_after=config.worker.prune_after,
        ack_delay=config.worker.ack_delay,
    )
    from ..http.serving import http_server  # lazy: the HTTP stack (the module docstring)

    logger.info("serving on http://%s", listen)
    server = http_server(app, listen)
    threads = [threading.Thread(target=scheduler.run, name="scheduler", daemon=True)]
    if not args.no_workers:
        threads.append(threading.Thread(target=worker.run, name="worker", daemon=True))
    with signals.listening(stop=lambda: setattr(server, "should_exit", True)):
        serving = threading.Thread(target=server.run, name="http", daemon=True)
        for thread in [serving, *threads]:
            thread.start()
        while serving.is_alive():
            serving.join(0.2)
        scheduler.stopping.set()
        worker.stop()
        for thread in threads:
            thread.join(args.stop_grace)  # the grace period ends a stop anyway
    if not server.should_exit:  # not stopped: it failed (uvicorn logged why)
        raise ExpiryError("the HTTP server stopped by itself: see the log above")
    return 0


def serve_process_metrics(listen: str) -> None:
    """This process's histograms (job durations, rows per window) and process
    figures on http://HOST:PORT/metrics, from a thread of prometheus_client's:
    a worker run apart from `expiry serve` has no other place to show them
    (serve's /metrics shows the database's state and its own process's)."""
    host, _, port = listen.rpartition(":")
    start_http_server(int(port), addr=host.strip("[]"))
    logger.info("worker metrics on http://%s/metrics", listen)


def checked_listen(listen: str, flag: str = "--listen") -> str:
    """HOST:PORT, and free: a bad or taken address is refused before the
    scheduler and workers start (exit 2 for a bad one, 1 for a taken one)."""
    try:
        check_listen(listen)
    except ValueError as exc:
        raise ConfigError(f"{flag} {exc}") from None
    host, _, port = listen.rpartition(":")
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), int(port)))
        except OSError as exc:
            raise ExpiryError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    return listen


def cmd_keys(args: argparse.Namespace) -> int:
    if args.action == "list":
        return keys_list(args, reading(args))
    app = migrated(args)
    if not args.name:
        raise ConfigError(f"usage: expiry keys {args.action} NAME")
    if args.action == "create":
        return keys_create(args, app)
    if args.action == "scope":
        app.keys.set_scopes(args.name, args.scope or [], actor=args.actor)
        emit(
            args,
            {"name": args.name, "scopes": args.scope},
            lambda: out.print(f"key {args.name}: {' '.join(args.scope)}"),
        )
        return 0
    if not app.keys.revoke(args.name, actor=args.actor):
        raise ConfigError(f"no active key named {args.name!r}")
    emit(args, {"name": args.name, "revoked": True}, lambda: out.print(f"key {args.name} revoked"))
    return 0


def keys_list(args: argparse.Namespace, app: App) -> int:
    keys = app.keys.all()
    found = [
        {
            "name": k.name,
            "scopes": list(k.scopes),
            "created_at": format_time(k.created_at),
            "revoked": k.revoked_at is not None,
        }
        for k in keys
    ]
    lines = [
        f"{k.name}  {'revoked' if k.revoked_at else 'active'}  {' '.join(k.scopes)}" for k in keys
    ]
    emit(args, found, lambda: out.print("\n".join(lines) or "no keys"))
    return 0


def keys_create(args: argparse.Namespace, app: App) -> int:
    scopes = args.scope or ["admin"]
    secret = app.keys.create(args.name, scopes, actor=args.actor)
    note = (
        "\n(an admin key may do everything: give --scope to narrow a new key)"
        if scopes == ["admin"]
        else ""
    )
    emit(
        args,
        {"name": args.name, "key": secret, "scopes": scopes},
        lambda: out.print(
            f"key {args.name} ({' '.join(scopes)}): {secret}\n"
            f"(shown once; send it as Authorization: Bearer KEY){note}"
        ),
    )
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    return set_paused(args, True)


def cmd_resume(args: argparse.Namespace) -> int:
    return set_paused(args, False)


def set_paused(args: argparse.Namespace, paused: bool) -> int:
    app = migrated(args, need_config=True)
    app.scheduler().set_paused(args.policy, paused, actor=args.actor)
    verb = "paused" if paused else "resumed"
    emit(
        args,
        {"policy": args.policy, "paused": paused},
        lambda: out.print(f"policy {args.policy} {verb}"),
    )
    return 0


# -- commands: runs -------------------------------------------------------------------


def cmd_trigger(args: argparse.Namespace) -> int:
    cutoff = parse_cutoff(args.cutoff)
    timeout = parse_timeout(args.timeout)
    if timeout is not None and not args.wait:
        raise ConfigError("--timeout bounds --wait: add --wait, or drop --timeout")
    if args.dry_run:
        return dry_run(args, reading(args, need_config=True), cutoff)
    app = migrated(args, need_config=True)
    cleanup = cleanup_of(app)
    opened = cleanup.open_run(
        args.policy, cutoff, opened_by="cli", actor=args.actor, force=args.force
    )
    if args.wait:
        return wait_for_run(args, app, opened.run_id, timeout)
    verb = "opened" if opened.created else "was already open"
    data = {
        "run_id": opened.run_id,
        "policy": opened.policy,
        "cutoff": format_time(opened.cutoff),
        "created": opened.created,
    }
    emit(args, data, lambda: out.print(f"run {opened.run_id} {verb}"))
    return 0


def wait_for_run(args: argparse.Namespace, app: App, run_id: str, timeout: float | None) -> int:
    """`trigger --wait`: the run's summary once it ends; exit 1 unless it finished
    with no dead window, or when --timeout passed first (the run goes on)."""
    summary = wait_with_progress(app.runs, run_id, show=not args.json, timeout=timeout)
    emit(args, summary, lambda: print_run(summary))
    if summary.get("timed_out"):
        logger.error(
            "stopped waiting after %s: %d of %d windows done; the run goes on",
            args.timeout,
            summary["jobs_done"],
            summary["jobs_total"],
            extra={"run": run_id},
        )
        return 1
    return 0 if summary["state"] == "finished" and not summary["jobs_dead"] else 1


def parse_timeout(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"--timeout {text!r}: {exc}") from None


def cmd_plan(args: argparse.Namespace) -> int:
    return dry_run(args, reading(args, need_config=True), parse_cutoff(args.cutoff))


def dry_run(args: argparse.Namespace, app: App, cutoff: datetime | None) -> int:
    """`plan` and `trigger --dry-run`: the preview reads the policy's table
    alone, so it answers before `expiry migrate` too, and says what is left
    to do then."""
    code = show_preview(args, app.table_reader().preview(args.policy, cutoff))
    problem = app.schema_problem()
    if problem is not None:
        logger.warning("%s (a dry run reads none of them; a run needs them)", problem)
    return code


def show_preview(args: argparse.Namespace, preview: PlanPreview) -> int:
    cutoff = format_time(preview.cutoff)
    data = {
        "policy": preview.policy,
        "cutoff": cutoff,
        "candidates": preview.candidates,
        "windows": preview.windows,
        "first_windows": [
            {**s.payload(windows=False), "range": s.describe()} for s in preview.first_windows
        ],
        "strategy": preview.strategy,
        "partitions": preview.partitions,
        "timestamp_storage": preview.storage,
        "warnings": preview.warnings,
        "dry_run": True,
    }
    emit(args, data, lambda: print_preview(preview, cutoff))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    app = reading(args)
    data: dict[str, Any] = {
        "policies": status.policies(app),
        "queue": status.queue(app),
        "workers_alive": status.workers_alive(app),
    }
    emit(args, data, lambda: print_status(data))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    verb = args.args[0] if args.args[:1] in (["show"], ["cancel"]) else None
    runs = (migrated(args) if verb == "cancel" else reading(args)).runs
    if verb is not None:
        if len(args.args) != 2:
            raise ConfigError(f"usage: expiry runs {verb} RUN_ID")
        found = (
            runs.cancel(args.args[1], actor=args.actor)
            if verb == "cancel"
            else runs.summary(args.args[1])
        )
        if found is None:
            raise ConfigError(f"no run {args.args[1]!r}")
        summary = found
        emit(args, summary, lambda: print_run(summary))
        return 0
    recent = runs.recent(args.args[0] if args.args else None)
    emit(args, recent, lambda: print_runs(recent))
    return 0


# -- commands: the evidence of deletion ---------------------------------------------


def cmd_evidence(args: argparse.Namespace) -> int:
    app = reading(args)
    since = parse_since(args.since, app)
    found = status.evidence(app, args.policy, since, limit=2**62)  # all of it
    if args.json or args.format == "json":
        print(json.dumps(found, indent=2))
    elif args.format == "csv":
        write_evidence_csv(found, sys.stdout)
    else:
        print_evidence(args.policy, found)
    return 0


def parse_since(text: str | None, app: App) -> datetime | None:
    """``--since``: an ISO-8601 time, or a duration back from the database's now."""
    if text is None:
        return None
    try:
        return since_of(text, app.engine.now())
    except ValueError as exc:
        raise ConfigError(f"--since {exc}") from None


# -- commands: the dead-letter queue ---------------------------------------------------


def cmd_dlq(args: argparse.Namespace) -> int:
    queue = (reading(args) if args.action in ("list", "show") else migrated(args)).queue
    if args.action == "list":
        return dlq_list(args, queue)
    if args.action == "show":
        return dlq_show(args, queue)
    if args.action == "redrive":
        if not (args.keys or args.all or args.policy):
            raise ConfigError("usage: expiry dlq redrive (KEY... | --all | --policy POLICY)")
        keys = queue.redrive(args.keys, all=args.all, policy=args.policy, actor=args.actor)
    else:
        if not args.keys:
            raise ConfigError("usage: expiry dlq discard KEY...")
        keys = queue.discard(args.keys, actor=args.actor)
    verb = "redriven" if args.action == "redrive" else "discarded"
    # A key named but not acted on: no dead job to redrive, or no job at all to
    # discard (discarding a job twice is fine). Said, exit 2; the others were done.
    missing = [
        k
        for k in args.keys
        if k not in set(keys) and (args.action == "redrive" or queue.get(k) is None)
    ]
    if missing:
        what = "dead job" if args.action == "redrive" else "job"
        raise ConfigError(
            f"no {what} with key {', '.join(map(repr, missing))} ({len(keys)} jobs {verb})"
        )
    emit(args, {verb: keys}, lambda: out.print(f"{len(keys)} jobs {verb}"))
    return 0


def dlq_list(args: argparse.Namespace, queue: Queue) -> int:
    dead = queue.dead(limit=1000)
    data = [
        {
            "key": j.key,
            "handler": j.handler,
            "attempt": j.attempt,
            "error": j.last_error,
            "kind": j.last_error_kind,
            "failed_at": format_time(j.finished_at) if j.finished_at else None,
        }
        for j in dead
    ]
    emit(args, data, lambda: print_dead_jobs(dead))
    return 0


def dlq_show(args: argparse.Namespace, queue: Queue) -> int:
    if len(args.keys) != 1:
        raise ConfigError("usage: expiry dlq show KEY")
    job = queue.get(args.keys[0])
    if job is None:
        raise ConfigError(f"no job with key {args.keys[0]!r}")
    shown = {
        "key": job.key,
        "handler": job.handler,
        "state": job.state.value,
        "payload": job.payload,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "errors": job.errors,
    }
    emit(args, shown, lambda: print_json(shown))
    return 0


# -- entry point ---------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logconfig.configure(args.log_format, args.log_level)
    try:
        return run_command(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.debug:
            raise
        code = 2 if isinstance(exc, ConfigError | SchemaError | MigrationError) else 1
        report_error(args, exc, code)
        return code


def run_command(args: argparse.Namespace) -> int:
    """The command; a long-running one (with --stop-grace) hears SIGTERM,
    SIGINT and SIGHUP from its start to its end (signals.py)."""
    if getattr(args, "stop_grace", None) is None:
        code: int = args.fn(args)
        return code
    with signals.listening(grace=args.stop_grace, exiting=True):
        code = args.fn(args)
        return code


def report_error(args: argparse.Namespace, exc: BaseException, code: int) -> None:
    """One line on stderr: the message (with the error's kind when it is not
    expiry's own), as JSON under --json."""
    message = (
        str(exc)
        if isinstance(exc, ExpiryError)
        else (f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    )
    if getattr(args, "json", False):
        kind = type(exc).__name__
        print(json.dumps({"error": message, "kind": kind, "exit": code}), file=sys.stderr)
    else:
        print(f"expiry: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
