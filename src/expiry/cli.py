"""The expiry command: parse, open the App, call the library, print.

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad config. Errors are one
line on stderr; --debug shows the traceback. Every option that takes a value
also reads an EXPIRY_* environment variable (see --help).
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.table import Table

from . import defaults, status
from . import log as logconfig
from .app import App
from .config import config_path
from .errors import ConfigError, ExpiryError, MigrationError, SchemaError

out = Console()
logger = logging.getLogger("expiry.cli")


def env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"EXPIRY_{name}", default)


class Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr with exit code 2, like every other error
    (argparse would print the whole usage block first). Subcommands inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def common() -> Parser:
    parser = Parser(add_help=False)
    parser.add_argument(
        "--config", default=env("CONFIG"), help="path to expiry.toml [EXPIRY_CONFIG]"
    )
    parser.add_argument(
        "--database-url",
        default=env("DATABASE_URL"),
        help="overrides [database] url [EXPIRY_DATABASE_URL]",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=env("LOG_FORMAT", "text"),
        help="[EXPIRY_LOG_FORMAT]",
    )
    parser.add_argument("--log-level", default=env("LOG_LEVEL", "INFO"), help="[EXPIRY_LOG_LEVEL]")
    parser.add_argument(
        "--debug",
        action="store_true",
        default=bool(env("DEBUG")),
        help="show tracebacks [EXPIRY_DEBUG]",
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parent = common()
    parser = Parser(
        prog="expiry", description="Durable, idempotent retention cleanup.", parents=[parent]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The common options after the command: without a default of their own, or
    # the subparser would overwrite `expiry --config X cmd` with its default.
    after = common()
    for action in after._actions:
        action.default = argparse.SUPPRESS

    def add(
        name: str, fn: Callable[[argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[after], help=help, description=help)
        p.set_defaults(fn=fn)
        return p

    demo = add("demo", cmd_demo, "build a sample SQLite marketplace and clean it, with a report")
    demo.add_argument(
        "--path", default=env("DEMO_PATH", "expiry-demo.db"), help="[EXPIRY_DEMO_PATH]"
    )
    demo.add_argument(
        "--rows",
        type=int,
        default=int(env("DEMO_ROWS", "1000000") or 0),
        help="rows across the four tables [EXPIRY_DEMO_ROWS]",
    )
    demo.add_argument("--workers", type=int, default=int(env("DEMO_WORKERS", "2") or 2))

    add("migrate", cmd_migrate, "create or upgrade expiry's own tables")
    add("check", cmd_check, "validate expiry.toml and every policy against the live schema")

    worker = add("worker", cmd_worker, "run jobs")
    worker.add_argument(
        "--app", default=env("APP"), help="MODULE:ATTR of an App with handlers [EXPIRY_APP]"
    )
    worker.add_argument(
        "--concurrency",
        type=int,
        default=int(env("CONCURRENCY", "0") or 0),
        help="job threads (default: [worker] concurrency) [EXPIRY_CONCURRENCY]",
    )
    worker.add_argument("--queue", action="append", default=None, help="queue to work (repeatable)")
    worker.add_argument(
        "--until-idle", action="store_true", help="exit 0 once nothing is due or running"
    )

    trigger = add("trigger", cmd_trigger, "start a run now (idempotent for the same cutoff)")
    trigger.add_argument("policy")
    trigger.add_argument("--cutoff", help="ISO-8601 cutoff (default: database now() - retain)")
    trigger.add_argument("--dry-run", action="store_true", help="show what the run would do")
    trigger.add_argument(
        "--force",
        action="store_true",
        help="accept a --cutoff later than now - retain (deletes rows still within retention)",
    )
    trigger.add_argument(
        "--wait", action="store_true", help="wait for the run; exit 1 if a window died"
    )
    trigger.add_argument("--actor", default=env("ACTOR", getpass.getuser()))

    plan = add("plan", cmd_plan, "dry-run: cutoff, candidate rows and windows; mutates nothing")
    plan.add_argument("policy")
    plan.add_argument("--cutoff")

    add("status", cmd_status, "policies, watermarks, queue and DLQ at a glance")

    add("scheduler", cmd_scheduler, "fire cron schedules only")
    serve = add("serve", cmd_serve, "scheduler, workers and the HTTP API in one process")
    serve.add_argument("--concurrency", type=int, default=int(env("CONCURRENCY", "0") or 0))
    serve.add_argument(
        "--listen", default=env("LISTEN"), help="HOST:PORT (default: [http] listen) [EXPIRY_LISTEN]"
    )
    serve.add_argument("--no-workers", action="store_true", help="serve the API and scheduler only")
    for verb in ("pause", "resume"):
        p = add(verb, cmd_pause if verb == "pause" else cmd_resume, f"{verb} a policy's schedule")
        p.add_argument("policy")
        p.add_argument("--actor", default=env("ACTOR", getpass.getuser()))

    keys = add("keys", cmd_keys, "API keys for the HTTP API: create NAME, list, revoke NAME")
    keys.add_argument("action", choices=["create", "list", "revoke"])
    keys.add_argument("name", nargs="?")

    runs = add("runs", cmd_runs, "recent runs, or `runs show RUN_ID`")
    runs.add_argument("args", nargs="*", metavar="POLICY | show RUN_ID")

    dlq = add("dlq", cmd_dlq, "dead-letter review: list, show KEY, redrive, discard")
    dlq.add_argument("action", choices=["list", "show", "redrive", "discard"])
    dlq.add_argument("keys", nargs="*")
    dlq.add_argument("--all", action="store_true", help="redrive every dead job")
    dlq.add_argument("--policy", help="redrive the dead jobs of one policy")
    dlq.add_argument("--actor", default=env("ACTOR", getpass.getuser()))
    return parser


# -- opening the App --------------------------------------------------------------


def open_app(args: argparse.Namespace, *, need_config: bool = False) -> App:
    if args.database_url:
        os.environ["EXPIRY_DATABASE_URL"] = args.database_url
    path = config_path(Path(args.config) if args.config else None)
    if path.exists():
        return App.from_config(path)
    if need_config or not args.database_url:
        raise ConfigError(f"no config file at {path}: pass --config PATH or set EXPIRY_CONFIG")
    return App(args.database_url)


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


def emit(args: argparse.Namespace, data: Any, render: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        render()


# -- commands ---------------------------------------------------------------------


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
    app = open_app(args, need_config=True)
    app.migrate()
    assert app.cleanup is not None
    warnings = app.cleanup.check()
    names = [p.name for p in app.cleanup.policies]
    timestamps = {
        p.name: f"{p.timestamp} read as {app.cleanup.target(p.name).storage.describe()}"
        for p in app.cleanup.policies
    }
    emit(
        args,
        {"ok": True, "policies": names, "warnings": warnings, "timestamps": timestamps},
        lambda: out.print(
            "\n".join(
                [f"warning: {w}" for w in warnings]
                + [f"policy {name}: {text}" for name, text in timestamps.items()]
                + [f"ok: {len(names)} policies"]
            )
        ),
    )
    return 0


def worked_queues(app: App) -> list[str]:
    """Without --queue: the default queue, and the queue of each handler the app
    registered, where a message published over HTTP to that name waits."""
    named = sorted(name for name in app.handlers if not name.startswith("expiry."))
    return [defaults.QUEUE, *(name for name in named if name != defaults.QUEUE)]


def cmd_worker(args: argparse.Namespace) -> int:
    from .worker import Worker

    app = load_app(args.app) if args.app else open_app(args)
    app.migrate()
    if app.cleanup is not None:
        for warning in app.cleanup.check():
            logger.warning(warning)
    settings = app.config.worker if app.config is not None else None
    concurrency = args.concurrency or (settings.concurrency if settings else 1)
    worker = Worker(
        app,
        concurrency=concurrency,
        queues=tuple(args.queue or worked_queues(app)),
        lease=settings.lease if settings else 60.0,
        batch=settings.claim_batch if settings else 16,
        until_idle=args.until_idle,
    )
    return worker.run()


def cmd_scheduler(args: argparse.Namespace) -> int:
    from .scheduler import Scheduler

    app = open_app(args, need_config=True)
    app.migrate()
    assert app.cleanup is not None
    for warning in app.cleanup.check():
        logger.warning(warning)
    return Scheduler(app).run()


def cmd_serve(args: argparse.Namespace) -> int:
    """HTTP API in the main thread (uvicorn handles SIGTERM), scheduler and
    workers in threads; when the server stops, they stop too."""
    import threading

    import uvicorn

    from .http import create_app
    from .scheduler import Scheduler
    from .worker import Worker

    app = open_app(args, need_config=True)
    app.migrate()
    assert app.cleanup is not None and app.config is not None
    for warning in app.cleanup.check():
        logger.warning(warning)
    settings = app.config.worker
    scheduler = Scheduler(app)
    worker = Worker(
        app,
        concurrency=args.concurrency or settings.concurrency,
        lease=settings.lease,
        batch=settings.claim_batch,
        prune_after=settings.prune_after,
    )
    threads = [threading.Thread(target=scheduler.run, name="scheduler", daemon=True)]
    if not args.no_workers:
        threads.append(threading.Thread(target=worker.run, name="worker", daemon=True))
    for thread in threads:
        thread.start()
    host, _, port = (args.listen or app.config.http.listen).rpartition(":")
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(app),
            host=host,
            port=int(port),
            log_config=None,
            access_log=False,
            lifespan="off",
        )
    )
    logger.info("serving on http://%s:%s", host, port)

    # uvicorn handles SIGTERM/SIGINT while it serves, then re-raises the signal
    # to the handler it found: without this one, the default, which kills the
    # process (exit -15) before the scheduler and workers are stopped.
    def on_stop(signum: int, frame: Any) -> None:
        server.should_exit = True

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
    server.run()
    scheduler.stopping.set()
    worker.stop()
    for thread in threads:
        thread.join(10)
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from .cleanup import format_time
    from .http.security import create_key, list_keys, revoke_key

    app = open_app(args)
    app.migrate()
    if args.action == "list":
        found = [
            {
                "name": k.name,
                "created_at": format_time(k.created_at),
                "revoked": k.revoked_at is not None,
            }
            for k in list_keys(app)
        ]
        emit(
            args,
            found,
            lambda: out.print(
                "\n".join(f"{k['name']}  {'revoked' if k['revoked'] else 'active'}" for k in found)
                or "no keys"
            ),
        )
        return 0
    if not args.name:
        raise ConfigError(f"usage: expiry keys {args.action} NAME")
    if args.action == "create":
        try:
            secret = create_key(app, args.name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        emit(
            args,
            {"name": args.name, "key": secret},
            lambda: out.print(
                f"key {args.name}: {secret}\n(shown once; send it as Authorization: Bearer KEY)"
            ),
        )
        return 0
    if not revoke_key(app, args.name):
        raise ConfigError(f"no active key named {args.name!r}")
    emit(args, {"name": args.name, "revoked": True}, lambda: out.print(f"key {args.name} revoked"))
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    return _set_paused(args, True)


def cmd_resume(args: argparse.Namespace) -> int:
    return _set_paused(args, False)


def _set_paused(args: argparse.Namespace, paused: bool) -> int:
    from .scheduler import Scheduler

    app = open_app(args, need_config=True)
    app.migrate()
    Scheduler(app).set_paused(args.policy, paused, actor=args.actor)
    verb = "paused" if paused else "resumed"
    emit(
        args,
        {"policy": args.policy, "paused": paused},
        lambda: out.print(f"policy {args.policy} {verb}"),
    )
    return 0


def cmd_trigger(args: argparse.Namespace) -> int:
    from .cleanup import format_time, parse_time

    app = open_app(args, need_config=True)
    app.migrate()
    cleanup = app.cleanup
    assert cleanup is not None
    cutoff = _cutoff(args.cutoff, parse_time)
    if args.dry_run:
        return _print_preview(args, cleanup.preview(args.policy, cutoff))
    opened = cleanup.open_run(
        args.policy, cutoff, opened_by="cli", actor=args.actor, force=args.force
    )
    data = {
        "run_id": opened.run_id,
        "policy": opened.policy,
        "cutoff": format_time(opened.cutoff),
        "created": opened.created,
    }
    if not args.wait:
        emit(
            args,
            data,
            lambda: out.print(
                f"run {opened.run_id} {'opened' if opened.created else 'was already open'}"
            ),
        )
        return 0
    summary = _wait(app, opened.run_id, show=not args.json)
    emit(args, summary, lambda: _print_run(summary))
    return 0 if summary["state"] == "finished" and not summary["jobs_dead"] else 1


def _cutoff(text: str | None, parse: Callable[[str], Any]) -> Any:
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError:
        raise ConfigError(f"--cutoff {text!r} is not ISO-8601, e.g. 2026-11-30T00:00:00Z") from None


def _wait(app: App, run_id: str, *, show: bool) -> dict[str, Any]:
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), disable=not show, transient=True) as progress:
        task = progress.add_task(run_id, total=None)
        while True:
            summary = status.run_summary(app, run_id)
            assert summary is not None
            done = summary["jobs_done"] + summary["jobs_dead"]
            progress.update(task, total=max(summary["jobs_total"], 1), completed=done)
            if summary["state"] == "finished":
                return summary
            if not _pending(app, run_id):
                # Nothing of the run is left to do, yet it is not finished: its last
                # job died (workers finish a run only after a success), or its
                # planning job did. Finish it if it was planned; either way, stop.
                assert app.cleanup is not None
                app.cleanup.finish_runs({run_id})
                return status.run_summary(app, run_id) or summary
            app.engine.wait_for_runs(0.2)


PENDING = ("scheduled", "available", "retryable", "running")


def _pending(app: App, run_id: str) -> int:
    """The run's jobs (planning and windows) not yet completed, dead or cancelled."""
    return sum(j.n for j in app.engine.run_jobs(run_id) if j.state in PENDING)


def cmd_plan(args: argparse.Namespace) -> int:
    from .cleanup import parse_time

    app = open_app(args, need_config=True)
    app.migrate()
    assert app.cleanup is not None
    return _print_preview(args, app.cleanup.preview(args.policy, _cutoff(args.cutoff, parse_time)))


def _print_preview(args: argparse.Namespace, preview: Any) -> int:
    from .cleanup import format_time

    data = {
        "policy": preview.policy,
        "cutoff": format_time(preview.cutoff),
        "candidates": preview.candidates,
        "windows": preview.windows,
        "first_windows": [{"lo": lo, "hi": hi} for lo, hi in preview.first_windows],
        "timestamp_storage": preview.storage,
        "dry_run": True,
    }

    def render() -> None:
        out.print(
            f"policy {preview.policy}: cutoff {data['cutoff']}, {preview.candidates} candidate "
            f"rows in {preview.windows} windows (dry run: nothing changed); timestamps "
            f"read as {preview.storage}"
        )
        for lo, hi in preview.first_windows:
            out.print(f"  window ({lo}, {hi}]")

    emit(args, data, render)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    app = open_app(args)
    app.migrate()
    data: dict[str, Any] = {"policies": status.policies(app), "queue": status.queue(app)}

    def render() -> None:
        table = Table(title="policies")
        for col in ("policy", "table", "action", "retain", "schedule", "watermark", "last run"):
            table.add_column(col)
        for p in data["policies"]:
            last = p["last_run"]
            table.add_row(
                p["name"],
                p["table"],
                p["action"],
                p["retain"],
                p["schedule"] or "-",
                p["watermark"],
                f"{last['state']} {last['jobs_done']}/{last['jobs_total']}" if last else "-",
            )
        out.print(table)
        q = data["queue"]
        states = Table(title="queue")
        for col in ("queue", "state", "jobs"):
            states.add_column(col)
        for name, by_state in q["jobs_by_queue_and_state"].items():
            for state, n in sorted(by_state.items()):
                states.add_row(name, state, str(n))
        out.print(states)
        out.print(
            f"oldest due: {q['oldest_due_seconds'] or 'none'}; running: {len(q['running'])}; "
            f"retries by kind: {q['retries_by_kind'] or 'none'}; dead-letter depth: {q['dead']}"
        )

    emit(args, data, render)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    app = open_app(args)
    app.migrate()
    if args.args[:1] == ["show"]:
        if len(args.args) != 2:
            raise ConfigError("usage: expiry runs show RUN_ID")
        summary = status.run_summary(app, args.args[1])
        if summary is None:
            raise ConfigError(f"no run {args.args[1]!r}")
        emit(args, summary, lambda: _print_run(summary))
        return 0
    found = status.runs(app, args.args[0] if args.args else None)

    def render() -> None:
        table = Table(title="runs")
        for col in ("run", "state", "windows done/total", "rows", "duplicates", "retries", "dead"):
            table.add_column(col)
        for r in found:
            table.add_row(
                r["id"],
                r["state"],
                f"{r['jobs_done']}/{r['jobs_total']}",
                str(r["rows_affected"]),
                str(r["duplicates_skipped"]),
                str(r["retries"]),
                str(r["jobs_dead"]),
            )
        out.print(table)

    emit(args, found, render)
    return 0


def _print_run(summary: dict[str, Any]) -> None:
    for key, value in summary.items():
        out.print(f"{key:>20}: {value}")


def cmd_dlq(args: argparse.Namespace) -> int:
    from .cleanup import format_time

    app = open_app(args)
    app.migrate()
    queue = app.queue
    if args.action == "list":
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

        def render() -> None:
            table = Table(title=f"dead-letter queue ({len(dead)})")
            for col in ("key", "handler", "attempts", "kind", "error"):
                table.add_column(col)
            for j in dead:
                table.add_row(
                    j.key,
                    j.handler,
                    str(j.attempt),
                    j.last_error_kind or "",
                    (j.last_error or "")[:80],
                )
            out.print(table)

        emit(args, data, render)
        return 0
    if args.action == "show":
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
        emit(args, shown, lambda: out.print_json(json.dumps(shown, default=str)))
        return 0
    if args.action == "redrive":
        if not (args.keys or args.all or args.policy):
            raise ConfigError("usage: expiry dlq redrive (KEY... | --all | --policy POLICY)")
        keys = queue.redrive(args.keys, all=args.all, policy=args.policy, actor=args.actor)
    else:
        if not args.keys:
            raise ConfigError("usage: expiry dlq discard KEY...")
        keys = queue.discard(args.keys, actor=args.actor)
    verb = "redriven" if args.action == "redrive" else "discarded"
    emit(args, {verb: keys}, lambda: out.print(f"{len(keys)} jobs {verb}"))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    report = run_demo(Path(args.path), rows=args.rows, workers=args.workers, show=not args.json)
    emit(args, report, lambda: None)
    return 0


# -- entry point ---------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logconfig.configure(args.log_format, args.log_level)
    try:
        code: int = args.fn(args)
        return code
    except (ConfigError, SchemaError, MigrationError) as exc:
        if args.debug:
            raise
        print(f"expiry: {exc}", file=sys.stderr)
        return 2
    except ExpiryError as exc:
        if args.debug:
            raise
        print(f"expiry: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"expiry: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
