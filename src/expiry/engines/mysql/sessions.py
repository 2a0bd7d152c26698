"""The MySQL/MariaDB engine's sessions: the URL, the connection and its
statements' echo, a migration script's statements, and which errors pass or
fail."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql
import pymysql.cursors

from ...errors import ConfigError

log = logging.getLogger("expiry.engine")


NOW_SQL = "utc_timestamp(6)"


# Error numbers that pass: lock wait timeout, deadlock, the statement timeouts
# (MariaDB's max_statement_time, MySQL's max_execution_time), a read-only server
# (--read-only, super_read_only, a replica), too many connections, the
# connection gone (client errors 2002 to 2013). A Galera node that is not in
# the cluster's primary component or not yet synced answers 1047 "WSREP has
# not yet prepared node for application use" (1047 is "Unknown command"
# elsewhere): classified by those words (engine.py), an outage.
TRANSIENT_ERRORS = {
    1205: "lock_timeout",
    1213: "deadlock",
    1969: "statement_timeout",
    3024: "statement_timeout",
    1290: "read_only",
    1836: "read_only",
    1792: "read_only",
    1040: "too_many_connections",
    1021: "disk_full",
    1114: "disk_full",
    1053: "admin_shutdown",
    1927: "connection_lost",
    2002: "connection_lost",
    2003: "connection_lost",
    2006: "connection_lost",
    2013: "connection_lost",
}


# A Galera cluster refuses a transaction that writes more than its
# wsrep_max_ws_rows rows (1180 at the statement) or wsrep_max_ws_size bytes
# (1105 at COMMIT), by these words: a smaller window passes.
WRITE_SET_LIMIT = ("wsrep_max_ws_rows exceeded", "maximum writeset size exceeded")


PERMANENT_ERRORS = {
    1146: "undefined_table",
    1054: "undefined_column",
    1142: "insufficient_privilege",
    1143: "insufficient_privilege",
    1044: "insufficient_privilege",
    1064: "syntax_error",
}


# A migration run again after a crash part-way meets what it made already:
# a table, column, key or trigger that exists is passed over.
EXISTS = {1050, 1060, 1061, 1359}


MIGRATION_LOCK = "expiry.migrate"


PING_AFTER_SECONDS = 5.0
"""A connection back from a rest longer than this is pinged before a statement-mode
transaction (one that would not begin with BEGIN, which finds a broken one
itself); one used since is not: a session lost meanwhile fails its statement,
a transient error that runs again."""


def split_statements(script: str) -> list[str]:
    """A script's statements: each ends with ';' at the end of a line (comment
    lines dropped)."""
    statements, buffer = [], []
    for line in script.splitlines():
        if line.lstrip().startswith("--") or not line.strip():
            continue
        buffer.append(line)
        if line.rstrip().endswith(";"):
            statements.append("\n".join(buffer).rstrip().rstrip(";"))
            buffer = []
    if buffer:
        statements.append("\n".join(buffer))
    return statements


_ECHO = re.compile(
    r"select\s+%\((\w+)\)s\s+as\s+`?(\w+)`?\s+from\s+dual(\s+where\s+row_count\(\)\s*>\s*0)?",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Echo:
    """``select %(p)s as c from dual [where row_count() > 0]``, a query's answer
    made of a bound value (MySQL has no RETURNING): read by the client, no round
    trip. With the condition, a row only when the statement before it changed
    one: the driver's row count is the server's row_count() (both count rows
    matched, CLIENT_FOUND_ROWS)."""

    param: str
    column: str
    changed: bool

    @classmethod
    def of(cls, statement: str) -> Echo | None:
        match = _ECHO.fullmatch(" ".join(statement.split()))
        return cls(match[1], match[2], match[3] is not None) if match else None


def parse_url(url: str) -> dict[str, Any]:
    """mysql://user:password@host:port/database (or mariadb://) as PyMySQL's
    connect() arguments."""
    parts = urlsplit(url)
    database = parts.path.lstrip("/")
    if not database:
        raise ConfigError(
            f"database url {url!r} names no database: use mysql://user@host:3306/dbname"
        )
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": unquote(parts.username or "root"),
        "password": unquote(parts.password or ""),
        "database": unquote(database),
    }


def utc(value: datetime) -> datetime:
    """An aware datetime as the naive UTC value a DATETIME(6) column holds."""
    if value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


class Connection:
    """A PyMySQL connection as the rest of expiry uses a driver connection:
    ``execute(sql, params)`` returns a cursor of dict rows."""

    def __init__(self, raw: pymysql.connections.Connection) -> None:
        self.raw = raw
        self.limits: tuple[str, str] | None = None
        self.in_transaction = False
        self.returned_at = time.monotonic()

    def execute(self, sql: str, params: Any = None) -> Any:
        cur = self.raw.cursor(pymysql.cursors.DictCursor)
        cur.execute(sql, bind(params) if params is not None else None)
        return cur


def bind(params: Any) -> Any:
    if isinstance(params, Mapping):
        return {k: utc(v) if isinstance(v, datetime) else v for k, v in params.items()}
    if isinstance(params, (list, tuple)):
        return [utc(v) if isinstance(v, datetime) else v for v in params]
    return params


def begin(conn: Connection, read_only: bool) -> None:
    """BEGIN, or START TRANSACTION READ ONLY: the server refuses a write in it."""
    if read_only:
        conn.execute("start transaction read only")
    else:
        conn.raw.begin()


def errno(exc: BaseException) -> int:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else 0


def inserts(statement: str) -> bool:
    return statement.lstrip().lower().startswith("insert")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*$")


def ms(value: str) -> float:
    """'2000ms', '2s' or '2000' (ms, as PostgreSQL reads a bare number) in ms."""
    match = _DURATION.match(str(value))
    if not match:
        raise ConfigError(f"cannot read {value!r} as a duration")
    number = float(match.group(1))
    return number * 1000 if match.group(2) == "s" else number
