"""SQLite engine: the standard library's sqlite3 on one file in WAL mode.

Limits, stated once: SQLite has one writer at a time, so every transaction is
BEGIN IMMEDIATE (take the write lock up front rather than fail on upgrade) and
claims need no SKIP LOCKED. There is no NOTIFY: idle workers poll the file
every 50 ms. The database clock is SQLite's, which is the host's clock. Each
thread gets its own connection; synchronous=NORMAL in WAL mode survives a
process crash but may lose the last commits on power loss.

Opened ``read_only`` (the commands that only read), the file is taken as it
is: one that does not exist is refused, not created, its journal mode is left
alone, and every connection is query_only, so SQLite refuses any write.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from ...defaults import SQLITE_POLL_SECONDS
from ...errors import ConfigError, MigrationError
from ...types import Job, NewJob
from ..common import Row, classify_exception, in_turns, load_migrations, load_queries, run_of
from ..kinds import SQLITE
from .tables import SQLiteTables

NOW_SQL = "((julianday('now') - 2440587.5) * 86400.0)"


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {col[0]: value for col, value in zip(cursor.description, row, strict=True)}


def split_statements(script: str) -> list[str]:
    """Split a migration into statements (triggers keep their inner semicolons)."""
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(
        part.strip().startswith("--") or not part.strip() for part in buffer.splitlines()
    ):
        statements.append(buffer.strip())
    return statements


def epoch(value: datetime) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


class SQLiteEngine(SQLiteTables):
    dialect = "sqlite"
    kind = SQLITE
    concurrent_writers = False
    # "database is locked" is the one writer's lock on the whole database, waited
    # for at BEGIN IMMEDIATE, before a window's first statement: a smaller window
    # would wait just as long. SQLite has no statement timeout. So no error
    # shrinks a window here; a busy database is retried with backoff as before.
    window_shrinks: frozenset[str] = frozenset()

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        self.url = url
        self.path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url
        self.read_only = read_only
        if read_only and self.path != ":memory:" and not os.path.exists(self.path):
            raise ConfigError(
                f"no SQLite database at {self.path}: a command that only reads creates "
                "none (check the url; `expiry migrate` creates the file with expiry's tables)"
            )
        self.queries = load_queries(__package__ or "expiry.engines.sqlite", {"$now": NOW_SQL})
        self.migrations = load_migrations(__package__ or "expiry.engines.sqlite")
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            conn.row_factory = _dict_row
            if self.read_only:
                conn.execute("pragma query_only = on")
            else:
                conn.execute("pragma journal_mode = wal")
            conn.execute("pragma synchronous = normal")
            conn.execute("pragma foreign_keys = on")
            # A statement inside a transaction keeps the pages it changes in a
            # statement journal, to undo it alone: in memory, not a temporary
            # file each window (it holds no committed data).
            conn.execute("pragma temp_store = memory")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
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
    ) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("begin" if self.read_only else "begin immediate")  # a reader locks nothing
        try:
            yield conn
            if completing is not None:
                self.job_complete(completing, conn)
        except BaseException:
            conn.execute("rollback")
            raise
        else:
            conn.execute("commit")

    @contextmanager
    def read_transaction(self) -> Iterator[sqlite3.Connection]:
        # Deferred: a reader takes no write lock, and waits for no writer (WAL).
        conn = self._conn()
        conn.execute("pragma query_only = on")
        try:
            conn.execute("begin")
            try:
                yield conn
            finally:
                conn.execute("rollback")  # it wrote nothing to commit
        finally:
            if not self.read_only:
                conn.execute("pragma query_only = off")

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        yield self._conn()

    def _rows(self, conn: Any, name: str, params: dict[str, Any] | None = None) -> list[Row]:
        cur = conn.execute(self.queries[name], params or {})
        return list(cur.fetchall()) if cur.description is not None else []

    def job_claim(
        self,
        queues: Sequence[str],
        n: int,
        lease_seconds: float,
        owner: str,
        fair_share: bool = False,
        limits: Mapping[str, int] | None = None,
    ) -> list[Job]:
        """Pick the best n due jobs across the queues (each read in its index
        order, at most its limit, the queues taking turns) and lease them, all
        in one IMMEDIATE transaction. ``fair_share``: at most half of the due
        jobs seen (rounded up, up to twice a queue's limit)."""
        limits = limits or {}
        if not self._any_due(queues):
            return []
        with self.transaction() as conn:
            seen, due = 0, []
            for q in queues:
                limit = min(n, limits.get(q, n))
                look = 2 * limit if fair_share else limit
                rows = self._rows(conn, "job_due", {"queue": q, "n": look})
                seen += len(rows)
                due += [(turn, row) for turn, row in enumerate(rows[:limit])]
            due.sort(key=lambda t: (t[1]["priority"], t[0], t[1]["run_at"], t[1]["id"]))
            if not due:
                return []
            take = min(n, (seen + 1) // 2) if fair_share else n
            ids = json.dumps([row["id"] for _, row in due[:take]])
            params = {"ids": ids, "lease": lease_seconds, "owner": owner}
            found = self._rows(conn, "job_claim", params)
        return in_turns(list(map(self._job, found)))

    def _any_due(self, queues: Sequence[str]) -> bool:
        """Whether a queue has a due job, read without the write lock: an idle
        worker's loops poll every SQLITE_POLL_SECONDS, and an IMMEDIATE
        transaction each time made a working job thread's BEGIN wait behind
        them in SQLite's busy handler (sleeps of 1 ms and more). The claim's
        own transaction reads again: this read only spares the lock."""
        with self.read_transaction() as conn:
            return any(self._rows(conn, "job_due", {"queue": q, "n": 1}) for q in queues)

    def _list(self, values: Sequence[Any]) -> Any:
        return json.dumps(list(values))

    def _time(self, value: Any) -> datetime:
        return datetime.fromtimestamp(float(value), UTC)

    def time_param(self, value: datetime) -> Any:
        return epoch(value)

    def _insert_params(self, jobs: Sequence[NewJob], payloads: list[str]) -> dict[str, Any]:
        items = [
            {
                "queue": j.queue,
                "handler": j.handler,
                "key": j.key,
                "payload": payload,
                "priority": j.priority,
                "max_attempts": j.max_attempts,
                "run_at": None if j.run_at is None else epoch(j.run_at),
                "delay": float(j.delay),
                "run_id": run_of(j),
            }
            for j, payload in zip(jobs, payloads, strict=True)
        ]
        return {"jobs": json.dumps(items)}

    def classify(self, exc: BaseException) -> tuple[bool, str]:
        known = classify_exception(exc)
        if known:
            return known
        if isinstance(exc, sqlite3.Error):
            text = str(exc).lower()
            if "locked" in text or "busy" in text:
                return True, "lock_timeout"
            if "readonly" in text or "read-only" in text:
                return True, "read_only"
            if "disk" in text and ("full" in text or "i/o" in text):
                return True, "disk_full"
            if "no such table" in text or "no such column" in text:
                return False, "undefined_table" if "table" in text else "undefined_column"
            if isinstance(exc, sqlite3.OperationalError):
                return True, "operational_error"
            return False, type(exc).__name__.lower()
        return True, type(exc).__name__

    def wait_for_jobs(self, timeout: float) -> None:
        super().wait_for_jobs(min(timeout, SQLITE_POLL_SECONDS))

    def schema_version(self) -> int:
        conn = self._conn()
        found = conn.execute(
            "select 1 from sqlite_master where name = 'expiry_schema_migrations'"
        ).fetchone()
        if not found:
            return 0
        row = conn.execute("select max(version) as v from expiry_schema_migrations").fetchone()
        return int(row["v"] or 0)

    def migrate(self) -> list[int]:
        applied: list[int] = []
        with self.transaction() as conn:
            conn.execute(
                "create table if not exists expiry_schema_migrations ("
                " version integer primary key, applied_at real not null)"
            )
            row = conn.execute("select max(version) as v from expiry_schema_migrations").fetchone()
            current = int(row["v"] or 0)
            self.check_schema_version(current)
            for version, sql in self.migrations:
                if version <= current:
                    continue
                try:
                    for statement in split_statements(sql):
                        conn.execute(statement)
                except sqlite3.Error as exc:
                    raise MigrationError(f"migration {version:04d} failed: {exc}") from exc
                conn.execute(
                    f"insert into expiry_schema_migrations values (?, {NOW_SQL})", (version,)
                )
                applied.append(version)
        return applied
