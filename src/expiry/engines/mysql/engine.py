"""MySQL and MariaDB engine: PyMySQL, one connection per thread; expiry's tables
live in the application's database, prefixed expiry_ (as on SQLite).

InnoDB at READ COMMITTED: a statement reads what committed before it began, as
on PostgreSQL, and locking reads lock rows, not gaps, so that claims and windows
of different keys never wait on each other. Claims use FOR UPDATE SKIP LOCKED
(MariaDB 10.6, MySQL 8.0). Times are the server's UTC clock, DATETIME(6). There
is no NOTIFY: idle workers poll every 100 ms (defaults.MYSQL_POLL_SECONDS). The session's time zone is
UTC, so that a target's TIMESTAMP column reads as UTC.

A named query may be several statements (queries/database.sql says why): they run in
order on one connection, in the caller's transaction, and the rows of the last
one that returns rows come back. An insert that meets an existing key (1062)
ends its query with no rows, the statement alone rolled back.

How its connections are set up and which errors pass is sessions.py's.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT, ER

from ...defaults import MYSQL_POLL_SECONDS
from ...errors import AlreadyApplied, MigrationError, TransientError
from ...types import EnqueueResult, Job, NewJob
from ..common import (
    Row,
    check_payload,
    classify_exception,
    enqueue_results,
    in_turns,
    load_migrations,
    load_queries,
    run_of,
)
from ..kinds import MYSQL
from .sessions import (
    EXISTS,
    MIGRATION_LOCK,
    NOW_SQL,
    PERMANENT_ERRORS,
    PING_AFTER_SECONDS,
    TRANSIENT_ERRORS,
    WRITE_SET_LIMIT,
    Connection,
    Echo,
    begin,
    bind,
    errno,
    inserts,
    ms,
    parse_url,
    split_statements,
    utc,
)
from .tables import MySQLTables

log = logging.getLogger("expiry.engine")


_FOREGROUND = """
select count(*) as n from information_schema.processlist
where command not in ('Daemon', 'Binlog Dump', 'Binlog Dump GTID', 'Killed')
  and user <> 'system user' and id <> connection_id() and id not in %(own)s
  and (command <> 'Sleep' or time < %(within)s)
  and coalesce(info, '') not like '%%expiry\\_%%'
"""
"""The sessions at work now or in the last ``within`` seconds (a sleeping
session's ``time`` is how long it has slept, in whole seconds), less this
process's own connections and any running expiry's statements."""


class MySQLEngine(MySQLTables):
    dialect = "mysql"
    kind = MYSQL
    next_key_reads = True
    window_shrinks = frozenset({"statement_timeout", "lock_timeout", "write_set_limit"})

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        self.url = url
        self.params = parse_url(url)
        self.queries = load_queries(__package__ or "expiry.engines.mysql", {"$now": NOW_SQL})
        self.statements = {
            name: [Echo.of(st) or st for st in split_statements(sql)]
            for name, sql in self.queries.items()
        }
        self.migrations = load_migrations(__package__ or "expiry.engines.mysql")
        self._local = threading.local()
        self._all: list[Connection] = []
        self._lock = threading.Lock()
        self._mariadb: bool | None = None

    # -- connections ------------------------------------------------------------

    def _open(self) -> Connection:
        raw = pymysql.connect(
            **self.params,
            autocommit=True,
            charset="utf8mb4",
            # row_count() counts rows matched, as PostgreSQL's row counts do.
            client_flag=CLIENT.FOUND_ROWS,
            init_command="set session time_zone = '+00:00'",
        )
        cur = raw.cursor()
        cur.execute("set session transaction isolation level read committed")
        if self._mariadb is None:
            cur.execute("select version()")
            self._mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
        return Connection(raw)

    def health_foreground_sessions(self, conn: Any, within: float) -> int | None:
        with self._lock:
            own = [int(c.raw.thread_id()) for c in self._all] or [0]  # type: ignore[no-untyped-call]
        # expiry's statements all name its own tables (a window's delete its
        # ledger guard): a session running one is expiry's, not the application's.
        row = conn.execute(_FOREGROUND, {"within": within, "own": own}).fetchone()
        return int(row["n"]) if row else 0

    @property
    def mariadb(self) -> bool:
        """MariaDB rather than MySQL (read as the first connection opens)."""
        if self._mariadb is None:
            self._open().raw.close()
        return bool(self._mariadb)

    def _take(self) -> Connection:
        """A connection of this thread's own that no transaction holds: a
        transaction opened inside another gets a second one, as the other
        engines' pools give it (never the same session, which would commit the
        first)."""
        free: list[Connection] = self._local.__dict__.setdefault("free", [])
        while free:
            conn = free.pop()
            if conn.raw.open:
                return conn
            self._forget(conn)
        conn = self._open()
        with self._lock:
            self._all.append(conn)
        return conn

    def _give(self, conn: Connection) -> None:
        conn.returned_at = time.monotonic()
        if conn.raw.open:
            self._local.__dict__.setdefault("free", []).append(conn)
        else:
            self._forget(conn)

    def _forget(self, conn: Connection) -> None:
        try:
            conn.raw.close()
        except Exception:  # noqa: S110 (broken already)
            pass
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                try:
                    conn.raw.close()
                except Exception:  # noqa: S110
                    pass
            self._all.clear()
        self._local = threading.local()

    @contextmanager
    def transaction(
        self,
        *,
        pipelined: bool = False,
        statement: bool = False,
        completing: Job | None = None,
        chain: bool = False,
    ) -> Iterator[Any]:
        """``statement``: the connection in autocommit, each statement its own
        transaction (ANALYZE TABLE, which would commit an open one); work of
        several statements goes in ``atomic(conn)``."""
        if statement and completing is not None:
            raise ValueError("a statement-mode transaction cannot complete a job at its end")
        with self._transaction(statement=statement) as conn:
            yield conn
            if completing is not None:
                self.job_complete(completing, conn)

    @contextmanager
    def read_transaction(self) -> Iterator[Any]:
        with self._transaction(statement=False, read_only=True) as conn:
            yield conn

    @contextmanager
    def _transaction(self, *, statement: bool, read_only: bool = False) -> Iterator[Connection]:
        """A connection of this thread's in a transaction (READ ONLY when asked),
        or in statement mode; committed when the block ends."""
        conn = self._take()
        try:
            try:
                if statement:  # a window's limits stay on the session, as on PostgreSQL
                    if time.monotonic() - conn.returned_at > PING_AFTER_SECONDS:
                        conn.raw.ping(reconnect=False)
                else:
                    if conn.limits is not None:
                        self._reset_limits(conn)
                    begin(conn, read_only)
            except pymysql.err.OperationalError:
                self._forget(conn)  # gone since its last use: one fresh try
                conn = self._open()
                with self._lock:
                    self._all.append(conn)
                if not statement:
                    begin(conn, read_only)
            with self._within(conn, begun=not statement):
                yield conn
        finally:
            self._give(conn)

    @contextmanager
    def atomic(self, conn: Any) -> Iterator[Any]:
        """A transaction of its own on a connection in statement mode; inside
        the caller's transaction, nothing more."""
        if conn.in_transaction:
            yield conn
            return
        conn.raw.begin()
        with self._within(conn, begun=True):
            yield conn

    @contextmanager
    def _within(self, conn: Connection, *, begun: bool) -> Iterator[None]:
        """Commit what ``conn`` began when the block ends, roll it back on an error."""
        conn.in_transaction = begun
        try:
            yield
        except BaseException as exc:
            conn.in_transaction = False
            if begun:
                try:
                    conn.raw.rollback()
                except Exception:
                    conn.raw.close()
            if errno(exc) == ER.DUP_ENTRY and "expiry_ledger" in str(exc).lower():
                raise AlreadyApplied(f"ledger: {exc}") from exc
            if isinstance(exc, pymysql.err.OperationalError) and errno(exc) >= 2000:
                conn.raw.close()
            raise
        else:
            conn.in_transaction = False
            if begun:
                try:
                    conn.raw.commit()
                except Exception:
                    conn.raw.close()
                    raise

    @contextmanager
    def connect(self) -> Iterator[Any]:
        """A dedicated connection (planner scans), autocommit until a transaction."""
        conn = self._open()
        try:
            yield conn
        finally:
            conn.raw.close()

    def session_limits(self, conn: Any, lock_timeout: str, statement_timeout: str) -> None:
        """A window's limits: innodb_lock_wait_timeout (whole seconds, at least 1)
        and the statement timeout (MariaDB's max_statement_time, in seconds, for
        every statement; MySQL's max_execution_time, in ms, binds SELECT only, so
        a window's DELETE there is bound by the lock wait alone)."""
        lock_s = max(1, round(ms(lock_timeout) / 1000))
        statement_s = ms(statement_timeout) / 1000
        if conn.limits == (lock_timeout, statement_timeout):
            return
        timeout = (
            f"max_statement_time = {statement_s:.3f}"
            if self.mariadb
            else f"max_execution_time = {int(statement_s * 1000)}"
        )
        conn.execute(f"set session innodb_lock_wait_timeout = {int(lock_s)}, {timeout}")
        conn.limits = (lock_timeout, statement_timeout)

    def _reset_limits(self, conn: Connection) -> None:
        timeout = "max_statement_time" if self.mariadb else "max_execution_time"
        conn.execute(f"set session innodb_lock_wait_timeout = default, {timeout} = default")
        conn.limits = None

    def table_vacuum(self, conn: Any, table: str) -> None:
        """A window's limits, left on the session in statement mode, never bind a
        whole table's ANALYZE."""
        if conn.limits is not None:
            self._reset_limits(conn)
        super().table_vacuum(conn, table)

    # -- named queries ------------------------------------------------------------

    def _rows(self, conn: Any, name: str, params: dict[str, Any] | None = None) -> list[Row]:
        bound = bind(params or {})
        found: list[Row] = []
        cur = conn.raw.cursor(pymysql.cursors.DictCursor)
        changed = 0
        for i, statement in enumerate(self.statements[name]):
            if isinstance(statement, Echo):
                answer = not statement.changed or changed > 0
                found = [{statement.column: bound[statement.param]}] if answer else []
                continue
            try:
                cur.execute(statement, bound)
                changed = cur.rowcount
            except pymysql.err.IntegrityError as exc:
                if errno(exc) == ER.DUP_ENTRY and i == 0 and inserts(statement):
                    return []  # the key exists: nothing inserted (ON CONFLICT DO NOTHING)
                raise
            if cur.description is not None:
                found = list(cur.fetchall())
        return found

    def job_prune(self, older_than_seconds: float, limit: int = 10_000) -> int:
        with self.transaction() as conn:
            cur = conn.execute(
                self.queries["job_prune"], {"age": older_than_seconds, "limit": limit}
            )
            return int(cur.rowcount)

    def job_insert_many(
        self, jobs: Sequence[NewJob], conn: Any | None = None
    ) -> list[EnqueueResult]:
        """Keys queued already are read first and the rest inserted in one
        statement. Should another transaction insert one of them meanwhile, the
        insert meets its key (1062: after that transaction commits), the
        statement alone rolls back, and the batch is read again."""
        if not jobs:
            return []
        payloads = [check_payload(job.payload) for job in jobs]
        first: dict[str, int] = {}
        for i, job in enumerate(jobs):
            first.setdefault(job.key, i)
        with self.transaction_or(conn) as c:
            for _ in range(5):
                keys = json.dumps(list(first))
                existing = {row["key"] for row in self._rows(c, "job_existing", {"keys": keys})}
                new = [i for key, i in first.items() if key not in existing]
                if not new:
                    inserted: set[str] = set()
                    break
                params = self._insert_params([jobs[i] for i in new], [payloads[i] for i in new])
                try:
                    c.execute(self.queries["job_insert_many"], params)
                except pymysql.err.IntegrityError as exc:
                    if errno(exc) == ER.DUP_ENTRY:
                        continue
                    raise
                inserted = {jobs[i].key for i in new}
                break
            else:
                raise TransientError("enqueue kept meeting keys inserted meanwhile")
        return enqueue_results(jobs, inserted)

    def job_claim(
        self,
        queues: Sequence[str],
        n: int,
        lease_seconds: float,
        owner: str,
        fair_share: bool = False,
        limits: Mapping[str, int] | None = None,
    ) -> list[Job]:
        """Lock the best due jobs of each queue (SKIP LOCKED, in its index order,
        at most its limit), take the best n of them, the queues taking turns, and
        lease those, in one transaction. ``fair_share``: at most half of the due
        jobs seen (counted without locks, up to twice a queue's limit)."""
        limits = limits or {}
        with self.transaction() as conn:
            seen, due = 0, []
            for q in queues:
                limit = min(n, limits.get(q, n))
                if fair_share:
                    row = self._rows(conn, "job_due_count", {"queue": q, "look": 2 * limit})
                    seen += int(row[0]["n"])
                rows = self._rows(conn, "job_due", {"queue": q, "n": limit})
                due += [(turn, row) for turn, row in enumerate(rows)]
            if not due:
                return []
            due.sort(key=lambda t: (t[1]["priority"], t[0], t[1]["run_at"], t[1]["id"]))
            take = min(n, (seen + 1) // 2) if fair_share else n
            ids = json.dumps([row["id"] for _, row in due[:take]])
            params = {"ids": ids, "lease": lease_seconds, "owner": owner}
            found = self._rows(conn, "job_claim", params)
        return in_turns(list(map(self._job, found)))

    def _list(self, values: Sequence[Any]) -> Any:
        return json.dumps(list(values))

    def _time(self, value: Any) -> datetime:
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime), value
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value

    def time_param(self, value: datetime) -> Any:
        return utc(value)

    def _insert_params(self, jobs: Sequence[NewJob], payloads: list[str]) -> dict[str, Any]:
        items = [
            {
                "queue": j.queue,
                "handler": j.handler,
                "key": j.key,
                "payload": payload,
                "priority": j.priority,
                "max_attempts": j.max_attempts,
                "run_at": None if j.run_at is None else utc(j.run_at).isoformat(sep=" "),
                "delay": float(j.delay),
                "run_id": run_of(j),
            }
            for j, payload in zip(jobs, payloads, strict=True)
        ]
        return {"jobs": json.dumps(items)}

    def wait_for_jobs(self, timeout: float) -> None:
        super().wait_for_jobs(min(timeout, MYSQL_POLL_SECONDS))

    def classify(self, exc: BaseException) -> tuple[bool, str]:
        known = classify_exception(exc)
        if known:
            return known
        if isinstance(exc, pymysql.err.MySQLError):
            code = errno(exc)
            if code in (1105, 1180) and any(w in str(exc).lower() for w in WRITE_SET_LIMIT):
                return True, "write_set_limit"
            if (code == 1047 and "wsrep" in str(exc).lower()) or (
                code == 1180 and "primary component" in str(exc).lower()
            ):
                return True, "node_not_ready"  # a node cut off from the majority, or resting
            if code in TRANSIENT_ERRORS:
                return True, TRANSIENT_ERRORS[code]
            if code in PERMANENT_ERRORS:
                return False, PERMANENT_ERRORS[code]
            if isinstance(exc, pymysql.err.OperationalError):
                return True, "operational_error"
            return False, type(exc).__name__.lower()
        if isinstance(exc, OSError):
            return True, "connection_lost"
        return True, type(exc).__name__

    # -- migrations ---------------------------------------------------------------

    def schema_version(self) -> int:
        with self.transaction() as conn:
            found = conn.execute(
                "select count(*) as n from information_schema.tables"
                " where table_schema = database() and table_name = 'expiry_schema_migrations'"
            ).fetchone()
            if not found["n"]:
                return 0
            row = conn.execute("select max(version) as v from expiry_schema_migrations").fetchone()
        return int(row["v"] or 0)

    def migrate(self) -> list[int]:
        """Apply the migrations not yet applied, one process at a time (GET_LOCK).
        MySQL commits each DDL statement on its own: a migration cut short is
        run again from its start, passing over what it made already."""
        applied: list[int] = []
        conn = self._open()
        try:
            got = conn.execute(f"select get_lock('{MIGRATION_LOCK}', 60) as ok").fetchone()["ok"]
            if got != 1:
                raise MigrationError("another process has been migrating for 60 s; try again")
            conn.execute(
                "create table if not exists expiry_schema_migrations ("
                " version integer primary key, applied_at datetime(6) not null)"
                " engine = InnoDB"
            )
            row = conn.execute("select max(version) as v from expiry_schema_migrations").fetchone()
            current = int(row["v"] or 0)
            self.check_schema_version(current)
            for version, sql in self.migrations:
                if version <= current:
                    continue
                for statement in split_statements(sql):
                    try:
                        conn.execute(statement, None)
                    except pymysql.err.MySQLError as exc:
                        if errno(exc) in EXISTS:
                            continue
                        raise MigrationError(f"migration {version:04d} failed: {exc}") from exc
                conn.execute(
                    f"insert into expiry_schema_migrations values (%s, {NOW_SQL})",  # noqa: S608 (a constant)
                    (version,),
                )
                applied.append(version)
        finally:
            try:
                conn.execute(f"select release_lock('{MIGRATION_LOCK}')")
            finally:
                conn.raw.close()
        return applied
