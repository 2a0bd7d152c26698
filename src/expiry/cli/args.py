"""What each command of the expiry command line accepts: the common options,
then one function per command adding its own. Every option that takes a value
also reads an EXPIRY_* environment variable; cli/main.py lists the commands.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import NoReturn

from .. import defaults
from ..times import parse_duration


def env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"EXPIRY_{name}", default)


def flag(name: str) -> bool:
    """A yes/no EXPIRY_* variable: 1, true, yes, on (any case) are yes; unset,
    empty, 0, false, no, off are no; anything else is a usage error."""
    value = (env(name) or "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    print(
        f"expiry: EXPIRY_{name}={value!r}: write 1 or 0 (true/false, yes/no, on/off)",
        file=sys.stderr,
    )
    raise SystemExit(2)


def whole(text: str) -> int:
    """A whole number >= 0 from an option or its EXPIRY_* variable."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def duration(text: str) -> float:
    """A duration with its unit ("30s", "2m") from an option or its EXPIRY_* variable."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def level(text: str) -> str:
    """A log level by name, any case."""
    name = text.upper()
    if name not in LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r}: use one of {', '.join(LEVELS)}")
    return name


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


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
    parser.add_argument(
        "--log-level", type=level, default=env("LOG_LEVEL", "INFO"), help="[EXPIRY_LOG_LEVEL]"
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=flag("DEBUG"),
        help="show tracebacks [EXPIRY_DEBUG]",
    )
    return parser


def no_args(parser: argparse.ArgumentParser) -> None:
    """The common options only."""


def actor_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--actor", default=env("ACTOR", getpass.getuser()))


def demo_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--path", default=env("DEMO_PATH", "expiry-demo.db"), help="[EXPIRY_DEMO_PATH]"
    )
    parser.add_argument(
        "--rows",
        type=whole,
        default=env("DEMO_ROWS", "1000000"),
        help="rows across the four tables [EXPIRY_DEMO_ROWS]",
    )
    parser.add_argument("--workers", type=whole, default=env("DEMO_WORKERS", "2"))


def worker_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--app", default=env("APP"), help="MODULE:ATTR of an App with handlers [EXPIRY_APP]"
    )
    parser.add_argument(
        "--concurrency",
        type=whole,
        default=env("CONCURRENCY", "0"),
        help="job threads (default: [worker] concurrency) [EXPIRY_CONCURRENCY]",
    )
    parser.add_argument(
        "--queue",
        action="append",
        default=None,
        help="an application queue to work (repeatable); expiry's own queues are "
        "worked too, unless one is named (expiry.policy.NAME, expiry.cron)",
    )
    parser.add_argument(
        "--until-idle", action="store_true", help="exit 0 once nothing is due or running"
    )
    parser.add_argument(
        "--metrics-listen",
        default=env("METRICS_LISTEN"),
        help="HOST:PORT to serve this process's /metrics on (job durations, rows per window, "
        "the process's own figures): for workers run apart from `expiry serve` "
        "[EXPIRY_METRICS_LISTEN]",
    )
    stop_args(parser)


def stop_args(parser: argparse.ArgumentParser) -> None:
    """The long-running commands: how long a stop may take (signals.py)."""
    parser.add_argument(
        "--stop-grace",
        type=duration,
        default=env("STOP_GRACE", f"{defaults.STOP_GRACE_SECONDS:g}s"),
        help="after SIGTERM or SIGINT, exit at once if the work in hand is not done "
        "within this long (a second signal exits at once) [EXPIRY_STOP_GRACE]",
    )


def trigger_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy")
    parser.add_argument("--cutoff", help="ISO-8601 cutoff (default: database now() - retain)")
    parser.add_argument("--dry-run", action="store_true", help="show what the run would do")
    parser.add_argument(
        "--force",
        action="store_true",
        help="accept a --cutoff later than now - retain (deletes rows still within retention)",
    )
    parser.add_argument(
        "--wait", action="store_true", help="wait for the run; exit 1 if a window died"
    )
    parser.add_argument(
        "--timeout",
        help='with --wait: stop waiting after this long (e.g. "10m"), exit 1; the run goes on',
    )
    actor_arg(parser)


def plan_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy")
    parser.add_argument("--cutoff")


def history_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy")
    parser.add_argument(
        "--minutes", type=int, default=60, help="how many minutes, up to now (1 to 1440)"
    )


def serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=whole, default=env("CONCURRENCY", "0"))
    parser.add_argument(
        "--listen", default=env("LISTEN"), help="HOST:PORT (default: [http] listen) [EXPIRY_LISTEN]"
    )
    parser.add_argument(
        "--no-workers", action="store_true", help="serve the API and scheduler only"
    )
    stop_args(parser)


def policy_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy")
    actor_arg(parser)


def keys_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["create", "list", "scope", "revoke"])
    parser.add_argument("name", nargs="?")
    parser.add_argument(
        "--scope",
        action="append",
        default=None,
        help="what the key may do (repeatable): admin, read, cleanup:trigger, cron:manage, "
        "dlq:manage, queue:publish:PATTERN, queue:consume:PATTERN; `create` without it: admin",
    )
    actor_arg(parser)


def runs_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "args", nargs="*", metavar="POLICY | show RUN_ID | cancel RUN_ID | approve RUN_ID"
    )
    actor_arg(parser)


def evidence_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy")
    parser.add_argument(
        "--since",
        help="the ledger from this ISO-8601 time, or this long ago (30d) by the database's "
        "clock; default: all of it that is kept",
    )
    parser.add_argument(
        "--format",
        choices=["text", "csv", "json"],
        default="text",
        help="text: a line a run; csv: a row an operation (a window or partition); json: "
        "the runs with their operations",
    )


def dlq_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["list", "show", "redrive", "discard"])
    parser.add_argument("keys", nargs="*")
    parser.add_argument("--all", action="store_true", help="redrive every dead job")
    parser.add_argument("--policy", help="redrive the dead jobs of one policy")
    actor_arg(parser)
