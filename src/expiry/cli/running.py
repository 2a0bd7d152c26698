"""The commands that set expiry up and run it: demo, migrate, check, worker,
scheduler, serve, keys, pause and resume."""

from __future__ import annotations

import argparse
import logging
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import start_http_server

from .. import defaults, signals
from ..app import App
from ..config import check_listen
from ..errors import ConfigError, ExpiryError
from ..queue.jobs import policy_queue
from ..times import format_time
from .demo import run_demo
from .opening import load_app, log_warnings, migrated, open_app, reading
from .output import (
    emit,
    out,
    print_check,
)

logger = logging.getLogger("expiry.cli")


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
