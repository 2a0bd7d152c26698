"""The expiry command: parse, open the App, call the library, print.

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad config. Errors are one
line on stderr; --debug shows the traceback. Every option that takes a value
also reads an EXPIRY_* environment variable (see --help).

One ``cmd_*`` function per command (running.py: setting up and running;
runs.py: runs, evidence, the dead-letter queue), over the services (Cleanup, Runs, Queue,
the App's worker and scheduler); what each command accepts is in cli/args.py,
how it prints in cli/output.py. A command that only reads opens the App with
``reading`` (read_only: it creates and alters nothing, not even an SQLite
file); one that writes opens it with ``migrated``. The HTTP stack (FastAPI,
uvicorn) is imported inside `expiry serve` only: it is most of a command's
start-up time otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence

from .. import log as logconfig
from .. import signals
from ..errors import ConfigError, ExpiryError, MigrationError, SchemaError
from .args import (
    Parser,
    common,
    demo_args,
    dlq_args,
    evidence_args,
    history_args,
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
from .running import (
    cmd_check,
    cmd_demo,
    cmd_keys,
    cmd_migrate,
    cmd_pause,
    cmd_resume,
    cmd_scheduler,
    cmd_serve,
    cmd_worker,
)
from .runs import (
    cmd_dlq,
    cmd_evidence,
    cmd_history,
    cmd_holds,
    cmd_plan,
    cmd_runs,
    cmd_status,
    cmd_trigger,
)

logger = logging.getLogger("expiry.cli")


Command = Callable[[argparse.Namespace], int]


Arguments = Callable[[argparse.ArgumentParser], None]


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
        ("holds", cmd_holds, "legal holds, and the expired rows each keeps per policy", no_args),
        (
            "history",
            cmd_history,
            "a policy's last minutes: rows cleaned, backlog, retries, dead letters, oldest row",
            history_args,
        ),
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
        ("runs", cmd_runs, "recent runs, `runs show RUN_ID`, `runs cancel RUN_ID`, `runs approve RUN_ID`", runs_args),
        ("dlq", cmd_dlq, "dead-letter review: list, show KEY, redrive, discard", dlq_args),
        ("evidence", cmd_evidence, "what a policy's runs deleted or archived, from the ledger", evidence_args),
    ]  # fmt: skip


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
