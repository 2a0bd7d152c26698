"""PostgreSQL engine: psycopg 3 with a connection pool; expiry's tables live in
the schema ``expiry`` of the application's database.

Workers share the pool. The rescuer and the NOTIFY listener each hold their own
connection so that a saturated pool never delays giving abandoned work back.

How its connections are set up and which errors pass is sessions.py's.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from ...errors import (
    AlreadyApplied,
    LeaseLost,
    MigrationError,
    TransientError,
)
from ...types import Job, NewJob
from ..common import Row, classify_exception, load_migrations, load_queries, run_of
from ..kinds import POSTGRES
from .sessions import (
    LEASE_LOST,
    MIGRATION_LOCK,
    PERMANENT_SQLSTATES,
    POOLER_FIX,
    TRANSIENT_SQLSTATES,
    autocommit,
    chained,
    check_if_idle,
    clear_limits,
    completing_transaction,
    configure,
    configure_pooled,
    limits_set,
    named,
    pipelined_transaction,
    probe,
    reset_limits,
    returned_at,
    unchain,
)
from .tables import PostgresTables

log = logging.getLogger("expiry.engine")


class PostgresEngine(PostgresTables):
    dialect = "postgres"
    kind = POSTGRES

    def __init__(self, url: str, *, pool_size: int = 4, pooler: str = "none") -> None:
        if pooler not in POSTGRES.poolers:
            raise ValueError(f"pooler {pooler!r}: use one of {', '.join(POSTGRES.poolers)}")
        self._applies: dict[str, str] = {}
        self.url = url
        self.transaction_pooler = pooler == "transaction"
        self._pooler_said = False
        """Behind a pooler in transaction mode ([database] pooler = "transaction")."""
        self._connect_options: dict[str, Any] = (
            # psycopg prepares no statement at all (prepare=True included): the
            # pooler's next client on that server connection would find it
            {"prepare_threshold": None} if self.transaction_pooler else {}
        )
        self._configure = configure_pooled if self.transaction_pooler else configure
        self.queries = load_queries(__package__ or "expiry.engines.postgres")
        self.migrations = load_migrations(__package__ or "expiry.engines.postgres")
        probe(url)
        self._conninfo = named(url)
        self.pool: ConnectionPool[psycopg.Connection[Row]] = ConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs={"row_factory": dict_row, "autocommit": False, **self._connect_options},
            configure=self._configure,
            open=True,
            check=check_if_idle,
        )
        self._listener: psycopg.Connection[Any] | None = None
        self._maintenance: psycopg.Connection[Row] | None = None
        self._maintenance_lock = threading.Lock()
        self._listener_lock = threading.Lock()
        self._woken = threading.Condition()
        self._hints = 0
        self._run_listener: psycopg.Connection[Any] | None = None
        self._run_listener_lock = threading.Lock()
        self._pin = threading.local()
        """Per thread: ``conn``, the connection pinned() holds (None outside), and
        ``busy``, whether a transaction or statement is using it now."""

    def close(self) -> None:
        self.pool.close()
        for conn in (self._listener, self._maintenance, self._run_listener):
            if conn is not None:
                conn.close()
        self._listener = self._maintenance = self._run_listener = None

    @contextmanager
    def _pooled(self, *, chained: bool = False) -> Iterator[psycopg.Connection[Row]]:
        """A connection of the pool, or the thread's pinned one when it is not
        busy (and not broken); then, but for a job's transaction (``chained``),
        outside the transaction a COMMIT AND CHAIN left open on it."""
        pin: psycopg.Connection[Row] | None = getattr(self._pin, "conn", None)
        if pin is not None and not self._pin.busy and not (pin.broken or pin.closed):
            self._pin.busy = True
            try:
                if not chained:
                    unchain(pin)
                yield pin
            finally:
                self._pin.busy = False
            return
        with self.pool.connection() as conn:
            try:
                yield conn
            finally:
                returned_at[conn] = time.monotonic()

    @contextmanager
    def pinned(self) -> Iterator[None]:
        if getattr(self._pin, "conn", None) is not None:  # pinned already: the outer block's
            yield
            return
        with self._pooled() as conn:
            self._pin.conn, self._pin.busy = conn, False
            try:
                yield
            finally:
                self._pin.conn = None
                unchain(conn)

    @contextmanager
    def transaction(
        self,
        *,
        pipelined: bool = False,
        statement: bool = False,
        completing: Job | None = None,
        chain: bool = False,
    ) -> Iterator[psycopg.Connection[Row]]:
        if statement and completing is not None:
            raise ValueError("a statement-mode transaction cannot complete a job at its end")
        plain = completing is not None and not pipelined
        with self._pooled(chained=plain) as conn:
            # A chain only where this thread's next job transaction takes it up.
            chain = chain and plain and conn is getattr(self._pin, "conn", None)
            try:
                with self._opened(conn, pipelined, statement, completing, chain):
                    yield conn
            except psycopg.errors.UniqueViolation as exc:
                # A window that took rows found its ledger key booked meanwhile.
                if exc.diag.schema_name == "expiry" and exc.diag.constraint_name == "ledger_pkey":
                    raise AlreadyApplied(f"ledger: {exc.diag.message_detail}") from exc
                raise
            except psycopg.errors.ReadOnlySqlTransaction:
                # A session opened while the database was read-only (a standby, or
                # default_transaction_read_only) stays so: drop it, so that the pool
                # connects afresh and writes resume once the database allows them.
                conn.close()
                raise
            except psycopg.Error as exc:
                if exc.sqlstate == LEASE_LOST:  # window_apply: the job is no longer ours
                    raise LeaseLost(exc.diag.message_primary or "lease lost") from exc
                if TRANSIENT_SQLSTATES.get(exc.sqlstate or "") == "pooler_mismatch":
                    raise TransientError(POOLER_FIX.format(exc), kind="pooler_mismatch") from exc
                raise

    @contextmanager
    def read_transaction(self) -> Iterator[psycopg.Connection[Row]]:
        with self.transaction() as conn:
            conn.execute("set transaction read only")  # before the first query, or refused
            yield conn

    @contextmanager
    def _opened(
        self, conn: Any, pipelined: bool, statement: bool, completing: Job | None, chain: bool
    ) -> Iterator[None]:
        """The pooled connection in the transaction ``transaction()`` was asked for,
        around the caller's block; the job's completion after it."""
        if statement:
            with autocommit(conn):
                yield
                # Behind a transaction pooler a window's limits opened a
                # transaction (session_limits): its statement commits with them.
                if (
                    self.transaction_pooler
                    and conn.info.transaction_status == TransactionStatus.INTRANS
                ):
                    conn.execute("commit")
            return
        if conn in limits_set:  # never a chained one: a job transaction reset them
            reset_limits(conn)
        if pipelined:
            with pipelined_transaction(conn):
                yield
                if completing is not None:
                    self._complete_strict(conn, completing)
        elif completing is not None:
            with completing_transaction(conn):
                yield
                if conn.info.transaction_status != TransactionStatus.INTRANS:
                    raise psycopg.ProgrammingError(
                        f"job {completing.key}: its handler ended the job's transaction "
                        "(a commit or rollback on tx, or a failed statement); the job's "
                        "work must commit with its completion"
                    )
                with conn.pipeline():  # the completion and COMMIT: one round trip
                    self._complete_strict(conn, completing)
                    conn.execute("commit and chain" if chain else "commit")
                if chain:  # committed, and inside the next one: keep it open
                    chained[conn] = time.monotonic()
        else:
            with conn.transaction():
                yield

    def _claim_rows(self, params: dict[str, Any]) -> list[Row]:
        """The claim in a transaction of its own, on the plan prepared once for
        the session: the planner would otherwise plan it afresh at every claim
        (its custom plans look cheaper than the generic one), which costs more
        than running it (1.4 ms against 0.9 ms for a one-job claim here). Its
        plan does not depend on the values: each queue's jobs_due index in
        order, then the picked rows by primary key. BEGIN, the setting, the
        claim and COMMIT go in one round trip (pipeline mode)."""
        with self._pooled() as conn, autocommit(conn), conn.pipeline() as pipeline:
            conn.execute("begin")
            conn.execute("set local plan_cache_mode = force_generic_plan")
            cur = conn.execute(self.queries["job_claim"], params, prepare=True)
            conn.execute("commit")
            pipeline.sync()
            return list(cur.fetchall())

    def _complete_strict(self, conn: Any, job: Job) -> None:
        """Queue the job's completion, which raises EX001 (LeaseLost) when its
        lease has moved on, behind the transaction's work: the COMMIT after it
        then commits nothing. Read at the pipeline's sync."""
        conn.execute(
            self.queries["job_complete_strict"],
            {"id": job.id, "token": job.lease_token},
            prepare=True,
        )

    @contextmanager
    def atomic(self, conn: Any) -> Iterator[Any]:
        """A transaction of its own on a connection outside one (statement mode);
        inside the caller's transaction, nothing more."""
        if conn.info.transaction_status == TransactionStatus.IDLE:
            with conn.transaction():
                yield conn
        else:
            yield conn

    @contextmanager
    def scratch(self, conn: Any) -> Iterator[Any]:
        """A savepoint rolled back when the block ends (psycopg's own, so that
        its view of the transaction stays right); the row locks taken inside
        end with it."""
        with conn.transaction(force_rollback=True):
            yield conn

    def session_limits(self, conn: Any, lock_timeout: str, statement_timeout: str) -> None:
        """Bind the statements that follow on ``conn`` by a policy's limits. Outside
        a transaction, on the session, and only when they differ from what a window
        set there last (a window is one statement: PostgreSQL arms its timeout as it
        starts); inside one, for that transaction."""
        limits = (lock_timeout, statement_timeout)
        idle = conn.info.transaction_status == TransactionStatus.IDLE
        if self.transaction_pooler:
            # Never on the session, which the pooler lends to other clients: the
            # limits and the statements they bind go in one transaction, opened
            # here in statement mode (the statement mode commits it at its end).
            if idle and conn.autocommit:
                conn.execute("begin")
            conn.execute(
                "select set_config('lock_timeout', %s, true),"
                " set_config('statement_timeout', %s, true)",
                (lock_timeout, statement_timeout),
                prepare=False,
            )
            return
        if idle and limits_set.get(conn) == limits:
            return
        conn.execute(
            "select set_config('lock_timeout', %s, %s), set_config('statement_timeout', %s, %s)",
            (lock_timeout, not idle, statement_timeout, not idle),
            prepare=True,
        )
        if idle:
            limits_set[conn] = limits

    def table_vacuum(self, conn: Any, table: str) -> None:
        """A window's limits, left on the session in statement mode, never bind a
        whole table's vacuum."""
        if conn in limits_set:
            clear_limits(conn)
        super().table_vacuum(conn, table)

    @contextmanager
    def connect(self) -> Iterator[psycopg.Connection[Row]]:
        """A dedicated connection outside the pool (rescuer, planner scans)."""
        conn = psycopg.connect(
            self._conninfo, row_factory=dict_row, autocommit=False, **self._connect_options
        )
        try:
            self._configure(conn)
            yield conn
        finally:
            conn.close()

    def _rows(self, conn: Any, name: str, params: dict[str, Any] | None = None) -> list[Row]:
        cur = conn.execute(self.queries[name], params or {}, prepare=True)
        if conn.pgconn.pipeline_status:
            # Pipelined: the description arrives with the result, which only a
            # read fetches (sending what is queued before it, in one round trip).
            try:
                return list(cur.fetchall())
            except psycopg.ProgrammingError as exc:
                if exc.sqlstate:  # the server's error (class 42: permission, syntax)
                    raise
                return []  # psycopg's own: the statement returns no rows
        return list(cur.fetchall()) if cur.description is not None else []

    def _run(self, conn: Any | None, name: str, params: dict[str, Any] | None = None) -> list[Row]:
        """A named query (always one statement). Without ``conn`` it runs in
        autocommit: one statement is its own transaction, and BEGIN and COMMIT
        would only add two round trips (claims, heartbeats, failures, releases,
        finishing runs)."""
        if conn is not None:
            return self._rows(conn, name, params)
        with self._pooled() as own:
            own.autocommit = True
            try:
                found = self._rows(own, name, params)
            except psycopg.errors.ReadOnlySqlTransaction:
                own.close()  # as in transaction(): reconnect once writes are allowed
                raise
            finally:
                # A broken connection cannot be switched back; the pool drops it.
                with suppress(psycopg.Error):
                    own.autocommit = False
        return found

    def _list(self, values: Sequence[Any]) -> Any:
        return list(values)

    def _time(self, value: Any) -> datetime:
        assert isinstance(value, datetime)
        return value

    def time_param(self, value: datetime) -> Any:
        return value

    def _insert_params(self, jobs: Sequence[NewJob], payloads: list[str]) -> dict[str, Any]:
        return {
            "queues": [j.queue for j in jobs],
            "handlers": [j.handler for j in jobs],
            "keys": [j.key for j in jobs],
            "payloads": payloads,
            "priorities": [j.priority for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            "run_ats": [j.run_at for j in jobs],
            "delays": [float(j.delay) for j in jobs],
            "run_ids": [run_of(j) for j in jobs],
        }

    def _notify(self, conn: Any, due_keys: set[str], jobs: Sequence[NewJob]) -> None:
        for queue in sorted({j.queue for j in jobs if j.key in due_keys}):
            self._rows(conn, "job_notify", {"queue": queue})

    def classify(self, exc: BaseException) -> tuple[bool, str]:
        transient, kind = self._classified(exc)
        if kind == "pooler_mismatch":
            self._say_pooler(exc)
        return transient, kind

    def _classified(self, exc: BaseException) -> tuple[bool, str]:
        known = classify_exception(exc)
        if known:
            return known
        if isinstance(exc, psycopg.Error):
            state = exc.sqlstate or ""
            if state in TRANSIENT_SQLSTATES:
                return True, TRANSIENT_SQLSTATES[state]
            if state.startswith("08") or (isinstance(exc, psycopg.OperationalError) and not state):
                return True, "connection_lost"
            return False, PERMANENT_SQLSTATES.get(state, type(exc).__name__.lower())
        if isinstance(exc, OSError):
            return True, "connection_lost"
        return True, type(exc).__name__

    def _say_pooler(self, exc: BaseException) -> None:
        """Once per process: the fix for statements lost behind a pooler."""
        if self._pooler_said:
            return
        self._pooler_said = True
        log.error(str(exc) if isinstance(exc, TransientError) else POOLER_FIX.format(exc))

    @contextmanager
    def maintenance_transaction(self) -> Iterator[psycopg.Connection[Row]]:
        """The rescuer's own connection, reopened if it broke."""
        with self._maintenance_lock:
            if self._maintenance is None or self._maintenance.closed:
                self._maintenance = psycopg.connect(
                    self._conninfo, row_factory=dict_row, **self._connect_options
                )
                self._configure(self._maintenance)
            try:
                with self._maintenance.transaction():
                    yield self._maintenance
            except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction):
                self._maintenance.close()
                raise

    def _open_listener(self) -> psycopg.Connection[Any]:
        if self._listener is None or self._listener.closed:
            self._listener = psycopg.connect(self._conninfo, autocommit=True)
            self._listener.execute("listen expiry_jobs")
        return self._listener

    def listen(self) -> None:
        """Open the LISTEN connection now: a hint sent after this call wakes the
        next wait_for_jobs even when it arrives before that wait starts. Behind
        a transaction pooler, nothing: a LISTEN there would be heard by whichever
        client the pooler lends its server connection to next, so workers poll."""
        if self.transaction_pooler:
            return
        with self._listener_lock:
            try:
                self._open_listener()
            except psycopg.Error as exc:
                log.warning("listen connection failed, polling instead: %s", exc)
                if self._listener is not None:
                    self._listener.close()
                self._listener = None

    def wait_for_jobs(self, timeout: float) -> None:
        """LISTEN for enqueue hints; polling remains the source of truth.

        One thread at a time listens on the one listener connection (two would
        race to open it and leak one); the others wait until it wakes. Behind a
        transaction pooler: polling only."""
        if self.transaction_pooler:
            super().wait_for_jobs(timeout)
            return
        if not self._listener_lock.acquire(blocking=False):
            with self._woken:
                self._woken.wait(timeout)
            return
        try:
            for _ in self._open_listener().notifies(timeout=timeout, stop_after=1):
                self._hints += 1
        except psycopg.Error as exc:
            log.warning("listen connection failed, polling instead: %s", exc)
            if self._listener is not None:
                self._listener.close()
            self._listener = None
            super().wait_for_jobs(timeout)
        finally:
            self._listener_lock.release()
            with self._woken:
                self._woken.notify_all()

    def hints_seen(self) -> int | None:
        return None if self.transaction_pooler else self._hints

    def wait_for_runs(self, timeout: float) -> None:
        """LISTEN for runs finishing, on a connection of its own (a worker's job
        hints are not consumed here, nor these there). The first call opens it;
        the state in expiry.runs remains the source of truth. Behind a
        transaction pooler: polling only."""
        if self.transaction_pooler:
            super().wait_for_runs(timeout)
            return
        with self._run_listener_lock:
            try:
                if self._run_listener is None or self._run_listener.closed:
                    self._run_listener = psycopg.connect(self._conninfo, autocommit=True)
                    self._run_listener.execute("listen expiry_runs")
                for _ in self._run_listener.notifies(timeout=timeout, stop_after=1):
                    pass
            except psycopg.Error as exc:
                log.warning("listen connection failed, polling instead: %s", exc)
                if self._run_listener is not None:
                    self._run_listener.close()
                self._run_listener = None
                super().wait_for_runs(timeout)

    def schema_version(self) -> int:
        with self.transaction() as conn:
            exists = conn.execute("select to_regclass('expiry.schema_migrations') as t").fetchone()
            if not exists or exists["t"] is None:
                return 0
            row = conn.execute("select max(version) as v from expiry.schema_migrations").fetchone()
        return int(row["v"] or 0) if row else 0

    def migrate(self) -> list[int]:
        # Up to date: nothing to create, so a role without CREATE (or a hot
        # standby) passes; only a migration takes the lock and creates.
        if self.schema_version() == self.migrations[-1][0]:
            return []
        applied: list[int] = []
        with self.transaction() as conn:
            conn.execute("select pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute("create schema if not exists expiry")
            conn.execute(
                "create table if not exists expiry.schema_migrations ("
                " version integer primary key,"
                " applied_at timestamptz not null default now())"
            )
            row = conn.execute("select max(version) as v from expiry.schema_migrations").fetchone()
            current = int(row["v"] or 0) if row else 0
            self.check_schema_version(current)
            for version, sql in self.migrations:
                if version <= current:
                    continue
                try:
                    conn.execute(sql.encode())
                except psycopg.Error as exc:
                    raise MigrationError(f"migration {version:04d} failed: {exc}") from exc
                conn.execute(
                    "insert into expiry.schema_migrations (version) values (%s)", (version,)
                )
                applied.append(version)
        for version in applied:
            log.info("applied migration %04d", version)
        return applied

    def __repr__(self) -> str:
        return f"PostgresEngine({json.dumps(self.url)})"
