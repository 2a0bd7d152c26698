"""The PostgreSQL engine's sessions: how a connection is configured (behind
a pooler too), the modes of a transaction (autocommit, pipelined, completing),
the limits a window sets and clears, and which SQLSTATEs pass or fail."""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from ...errors import (
    DatabaseUnavailable,
)

log = logging.getLogger("expiry.engine")


# SQLSTATEs that pass: lock_not_available, query_canceled (statement_timeout),
# deadlock_detected, serialization_failure, read_only_sql_transaction (a
# standby or a read-only target), disk_full, out_of_memory, too_many_connections,
# admin_shutdown, cannot_connect_now. Class 08 (connection) passes too.
TRANSIENT_SQLSTATES = {
    "55P03": "lock_timeout",
    "57014": "statement_timeout",
    "40P01": "deadlock",
    "40001": "serialization_failure",
    "25006": "read_only",
    "53100": "disk_full",
    "53200": "out_of_memory",
    "53300": "too_many_connections",
    "57P01": "admin_shutdown",
    "57P02": "crash_shutdown",
    "57P03": "cannot_connect_now",
    # A statement prepared on a server connection is taken or gone: a pooler in
    # transaction mode lends that connection to others ([database] pooler).
    "42P05": "pooler_mismatch",
    "26000": "pooler_mismatch",
}


PERMANENT_SQLSTATES = {
    "42P01": "undefined_table",
    "42703": "undefined_column",
    "42501": "insufficient_privilege",
}


# Raised by expiry.window_apply (migration 0004) when the job's lease moved on.
LEASE_LOST = "EX001"


IDLE_CHECK_SECONDS = 1.0


# Any stable number: serializes concurrent migrators across processes.
MIGRATION_LOCK = 0x65787069


def configure(conn: psycopg.Connection[Any]) -> None:
    # UTC so that a target's "timestamp without time zone" compares as UTC (a
    # transaction pooler carries TimeZone to every server connection it lends:
    # pgbouncer tracks it, as it tracks application_name).
    conn.execute("set timezone to 'UTC'")
    # A statement whose client has gone fails within a second instead of running
    # on: the backend of a worker killed during a window rolls it back rather
    # than committing it by itself (a window is one statement, its own transaction).
    conn.execute("set client_connection_check_interval to '1s'")
    conn.commit()


def configure_pooled(conn: psycopg.Connection[Any]) -> None:
    """``configure`` behind a transaction pooler: the time zone only, which the
    pooler carries; any other session setting would land on one server
    connection and stay there for the pooler's other clients."""
    conn.execute("set timezone to 'UTC'")
    conn.commit()


POOLER_FIX = (
    "{}: a pooler in transaction mode (pgbouncer) stands between expiry and PostgreSQL; "
    'set [database] pooler = "transaction" (jobs wait meanwhile, spending no attempt)'
)
"""What a statement prepared on a lent server connection and found taken or
gone says (SQLSTATE 42P05, 26000)."""


# The limits (lock_timeout, statement_timeout) a window last set on a pooled
# connection's session, so that the next window of the same policy sets nothing,
# and a transaction of any other kind resets them first.
limits_set: weakref.WeakKeyDictionary[psycopg.Connection[Any], tuple[str, str]] = (
    weakref.WeakKeyDictionary()
)


# When each pooled connection was last given back (monotonic seconds). Noted by
# PostgresEngine._pooled, not by the pool's reset hook: psycopg_pool runs that
# hook on one of its worker threads, and a connection returned through it is
# back only once that thread has run, which on a busy machine can take longer
# than the job loop takes to ask for it again.
returned_at: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = weakref.WeakKeyDictionary()


# Connections left inside an empty transaction by COMMIT AND CHAIN (a job's
# transaction with chain=True), with when it was opened (monotonic seconds): the
# thread's next job transaction starts in it instead of sending BEGIN. A chained
# connection stays in autocommit (psycopg cannot switch it inside a transaction).
chained: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = weakref.WeakKeyDictionary()


CHAIN_FRESH_SECONDS = 0.05
"""A job's transaction starts in a chained one opened at most this long ago;
an older one is rolled back and a fresh one begun, so that now() in a job's
transaction (its start) is never older than this when the job begins."""


def unchain(conn: psycopg.Connection[Any]) -> None:
    """Roll back the empty transaction COMMIT AND CHAIN left open, if any, and
    give the connection back its default mode: for any use but a job's
    transaction (a claim, a failure's record, the pool)."""
    if chained.pop(conn, None) is None:
        return
    with suppress(psycopg.Error):  # a broken connection: the pool drops it
        conn.execute("rollback")
        conn.autocommit = False


def check_if_idle(conn: psycopg.Connection[Any]) -> None:
    """Check a connection with a round trip only when it sat in the pool for a
    while (the server may have restarted or cut it meanwhile). One back within
    the last IDLE_CHECK_SECONDS worked then: a busy worker's window transactions
    skip the extra round trip, and a connection broken in that gap fails one
    transaction, which retries (a broken connection leaves the pool on return)."""
    if time.monotonic() - returned_at.get(conn, float("-inf")) > IDLE_CHECK_SECONDS:
        ConnectionPool.check_connection(conn)


PROBE_TIMEOUT_SECONDS = 10


def probe(url: str) -> None:
    """One connection before the pool opens, so that a database that does not
    exist, a wrong password or a server that is down fails at once with the
    server's own words, not after the pool's 30 s wait as a PoolTimeout."""
    try:
        psycopg.connect(url, connect_timeout=PROBE_TIMEOUT_SECONDS).close()
    except psycopg.OperationalError as exc:
        info = conninfo_to_dict(url)
        where = f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
        reason = " ".join(str(exc).split())
        raise DatabaseUnavailable(f"cannot connect to PostgreSQL at {where}: {reason}") from exc


def named(url: str) -> str:
    """``url`` with ``application_name = expiry`` for expiry's sessions, so that
    an operator finds them in pg_stat_activity (and a DBA's pg_terminate_backend
    can aim), unless the URL or PGAPPNAME names them already."""
    if "application_name" in conninfo_to_dict(url) or os.environ.get("PGAPPNAME"):
        return url
    return make_conninfo(url, application_name=APPLICATION_NAME)


APPLICATION_NAME = "expiry"
"""The application_name expiry's PostgreSQL sessions carry by default."""


@contextmanager
def autocommit(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """The connection outside any transaction: each statement its own, unless the
    caller opens one (Engine.atomic, or BEGIN written out). A transaction still
    open at the end (after an error, or a Python exception before its COMMIT) is
    rolled back, and the connection goes back to the pool as it came."""
    if not conn.autocommit:  # a chained connection is already (and cannot be set)
        conn.autocommit = True
    try:
        yield
    finally:
        if conn not in chained:  # else its COMMIT AND CHAIN opened the next one
            with suppress(psycopg.Error):  # a broken connection: the pool drops it
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    conn.rollback()
                conn.autocommit = False


@contextmanager
def pipelined_transaction(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A transaction in pipeline mode, BEGIN queued with its first statements and
    COMMIT with its last. Written out rather than conn.transaction(), which in
    pipeline mode syncs after BEGIN and again before COMMIT: two round trips.
    In autocommit, else psycopg sends a BEGIN of its own, and waits for it."""
    with autocommit(conn), conn.pipeline() as pipeline:
        conn.execute("begin")
        try:
            yield
        except BaseException:
            # Collect what an error left queued (the server skipped it, COMMIT
            # included, until the pipeline's sync), so that leaving the pipeline
            # does not report it again.
            with suppress(psycopg.Error):
                pipeline.sync()
            raise
        conn.execute("commit")


@contextmanager
def completing_transaction(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A job's transaction whose last statements, the completion and COMMIT, the
    caller sends together in pipeline mode: one round trip, where
    conn.transaction() would wait for the completion and then for the COMMIT.
    BEGIN is written out in autocommit (psycopg's would be the same round trip),
    so a handler's own ``with tx.transaction():`` is a savepoint inside it, as
    in conn.transaction(); or, on a connection a fresh COMMIT AND CHAIN left
    inside an empty transaction, not sent at all. Rolled back when the block
    raises (autocommit); left open when the caller chained its COMMIT."""
    opened = chained.pop(conn, None)
    if opened is not None and time.monotonic() - opened > CHAIN_FRESH_SECONDS:
        conn.execute("rollback")  # too old a start for now(): begin afresh
        opened = None
    with autocommit(conn):
        if opened is None:
            conn.execute("begin")
        yield


def reset_limits(conn: psycopg.Connection[Any]) -> None:
    """Give a connection back its own limits before a transaction that is not a
    window's (a handler's statements are not bound by a policy's timeouts)."""
    conn.autocommit = True
    try:
        clear_limits(conn)
    finally:
        conn.autocommit = False


def clear_limits(conn: psycopg.Connection[Any]) -> None:
    conn.execute("reset lock_timeout")
    conn.execute("reset statement_timeout")
    del limits_set[conn]
