"""The primitives each engine provides, on which the rest of the seam is written
once: transactions, named queries, stored times, rows to jobs; and the clock."""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from ...errors import (
    MigrationError,
)
from ...types import (
    Job,
    JobState,
    NewJob,
)
from ..common import SCHEMA_DRIFT_KINDS, Row, classify_exception
from ..kinds import Kind


class Primitives(abc.ABC):
    """One database that holds both the application's tables and expiry's: what
    each engine implements."""

    dialect: str
    kind: Kind
    """What this kind of database is and can do (engines/kinds.py)."""
    url: str
    queries: dict[str, str]
    migrations: list[tuple[int, str]]

    window_shrinks: frozenset[str] = frozenset({"statement_timeout", "lock_timeout"})
    """The kinds of error (``classify``) that a smaller window may pass: its
    delete ran out of time (past the policy's statement_timeout, or waiting
    past its lock_timeout for a row that live traffic holds), or (a Galera
    cluster) wrote more rows than one transaction may. A window whose attempts
    end in one is retried smaller, down to one row (cleanup/window.py)."""

    next_key_reads: bool = False
    """A locking range read (a window's delete) also waits on the lock of the
    first row past its range (InnoDB): a window cut before a held row must end
    one candidate earlier, and that candidate is kept with it (cleanup/window.py's
    _around_held)."""

    concurrent_writers: bool = True
    """Two connections can write at once. A worker claims its next batch while
    it runs one only where they can: on SQLite (one writer at a time) that
    claim would wait for the batch's own transactions."""

    @abc.abstractmethod
    @contextmanager
    def transaction(
        self,
        *,
        pipelined: bool = False,
        statement: bool = False,
        completing: Job | None = None,
        chain: bool = False,
    ) -> Iterator[Any]:
        """A driver connection inside a transaction, committed on success.

        ``completing``: the block's work is this job's, and the transaction
        completes the job as its last statement when the block ends: raises
        LeaseLost, and commits nothing, when the lease has moved on. An engine
        may send the completion with the COMMIT (PostgreSQL: one round trip).
        Not with ``statement``.

        ``chain``: with ``completing``, inside ``pinned()``, where the engine
        can (PostgreSQL): the COMMIT opens the next transaction (COMMIT AND
        CHAIN), which the thread's next ``transaction(completing=...)`` starts
        in instead of sending BEGIN: a job a round trip. Anything else the
        thread does with the connection first rolls the empty one back. Others
        ignore it.

        ``pipelined``: where the driver can, statements are queued and sent
        together when a result is read, BEGIN with the first of them and COMMIT
        with the last (PostgreSQL's pipeline mode); an error of a statement whose
        result is never read surfaces at commit. Others ignore it.

        ``statement``: where the engine can, the connection comes outside any
        transaction, so that one statement is its own transaction, sent without
        BEGIN or COMMIT (PostgreSQL's autocommit); work of several statements
        goes in ``atomic(conn)``. Others give an ordinary transaction."""

    @abc.abstractmethod
    @contextmanager
    def read_transaction(self) -> Iterator[Any]:
        """A transaction that may only read, for the checks and dry runs: the
        database itself refuses a write in it (PostgreSQL's and MySQL's READ
        ONLY transactions, SQLite's query_only), so a statement that would
        change something fails instead of changing it. On a hot standby too."""

    @contextmanager
    def atomic(self, conn: Any) -> Iterator[Any]:
        """Statements that must commit together, on a connection from
        ``transaction()``: in statement mode, a transaction of their own;
        otherwise they are in the caller's already."""
        yield conn

    @contextmanager
    def scratch(self, conn: Any) -> Iterator[Any]:
        """Statements inside the caller's transaction whose changes end with
        the block, whatever happens in it (a savepoint, rolled back): an error
        inside leaves the transaction as it was before the block, and is
        raised. Row locks taken inside end with it on PostgreSQL; InnoDB keeps
        them to the transaction's end."""
        conn.execute("savepoint expiry_scratch")
        try:
            yield conn
        finally:
            conn.execute("rollback to savepoint expiry_scratch")
            conn.execute("release savepoint expiry_scratch")

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """The calling thread keeps one connection for the block: its
        transactions and statements run on it, one after another, instead of
        taking one from the pool each (a worker's claimed batch), and a chained
        transaction (``transaction(chain=True)``) can pass on to the next. A
        call made while the pinned connection is busy (inside one of its
        transactions) takes a connection of its own, as outside the block. Where
        connections are not pooled (SQLite) or not chained (MySQL), nothing."""
        yield

    def session_limits(self, conn: Any, lock_timeout: str, statement_timeout: str) -> None:
        """Bind the statements that follow on ``conn`` by these limits, where the
        engine has them (PostgreSQL); values like '2000ms'. SQLite has none: its
        single writer waits out busy_timeout instead."""
        return None

    @abc.abstractmethod
    def _rows(self, conn: Any, name: str, params: dict[str, Any] | None = None) -> list[Row]:
        """Run a named query on ``conn`` and return its rows as dicts."""

    def _job(self, row: Row) -> Job:
        """A jobs row as a Job: payload and errors decoded where the driver hands
        them over as JSON text (SQLite, MySQL; PostgreSQL's jsonb arrives
        decoded), times through ``_time``."""

        def loaded(value: Any) -> Any:
            return json.loads(value) if isinstance(value, str) else value

        return Job(
            id=row["id"],
            queue=row["queue"],
            handler=row["handler"],
            key=row["key"],
            payload=loaded(row["payload"]),
            state=JobState(row["state"]),
            priority=row["priority"],
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            run_at=self._time(row["run_at"]),
            lease_owner=row["lease_owner"],
            lease_token=row["lease_token"],
            lease_expires_at=self._maybe_time(row["lease_expires_at"]),
            last_error=row["last_error"],
            last_error_kind=row["last_error_kind"],
            errors=loaded(row["errors"]),
            created_at=self._maybe_time(row["created_at"]),
            attempted_at=self._maybe_time(row["attempted_at"]),
            finished_at=self._maybe_time(row["finished_at"]),
            wait_reason=row.get("wait_reason"),
            waiting_since=self._maybe_time(row.get("waiting_since")),
        )

    @abc.abstractmethod
    def _insert_params(self, jobs: Sequence[NewJob], payloads: list[str]) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _list(self, values: Sequence[Any]) -> Any:
        """A list of strings or numbers as this driver binds it for ``= any``/``in``."""

    @abc.abstractmethod
    def _time(self, value: Any) -> datetime:
        """A time as this engine stores it, as an aware datetime."""

    def _maybe_time(self, value: Any) -> datetime | None:
        return None if value is None else self._time(value)

    @abc.abstractmethod
    def time_param(self, value: datetime) -> Any:
        """A datetime as this engine stores expiry's own times."""

    @abc.abstractmethod
    def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied."""

    @abc.abstractmethod
    def schema_version(self) -> int: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def classify(self, exc: BaseException) -> tuple[bool, str]:
        """(transient, kind) for an error raised while running a job. Unknown
        errors count as transient: they retry with backoff until the budget ends."""
        return classify_exception(exc) or (True, type(exc).__name__)

    def schema_drift(self, exc: BaseException) -> bool:
        """Whether ``exc`` says a table or column is missing (SCHEMA_DRIFT_KINDS)."""
        return self.classify(exc)[1] in SCHEMA_DRIFT_KINDS

    @contextmanager
    def maintenance_transaction(self) -> Iterator[Any]:
        """A transaction for the rescuer, kept off the workers' pool where possible."""
        with self.transaction() as conn:
            yield conn

    def listen(self) -> None:  # noqa: B027
        """Start receiving hints of new work before the first wait (PostgreSQL's
        LISTEN; engines without hints poll, and need nothing)."""

    def wait_for_jobs(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds, returning early on a hint of new work."""
        time.sleep(timeout)

    def hints_seen(self) -> int | None:
        """How many hints of new work ``wait_for_jobs`` has received so far, or
        None for an engine that receives none (its workers poll). A worker loop
        that found its queues empty claims them again before a poll has passed
        only once this has moved."""
        return None

    def wait_for_runs(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds, returning early on a hint that a run
        finished (PostgreSQL's LISTEN; engines without hints sleep)."""
        time.sleep(timeout)

    def check_schema_version(self, current: int) -> None:
        latest = self.migrations[-1][0]
        if current > latest:
            raise MigrationError(
                f"the database is at expiry schema version {current}, newer than this "
                f"expiry knows ({latest}); upgrade expiry before running it here"
            )

    @contextmanager
    def transaction_or(self, conn: Any | None) -> Iterator[Any]:
        """``conn`` itself when given (the work joins the caller's transaction),
        else a new transaction from ``transaction()``, committed when the block
        ends: for services whose methods run in a caller's transaction or alone."""
        if conn is not None:
            yield conn
        else:
            with self.transaction() as own:
                yield own

    def _tx_rows(
        self, conn: Any | None, name: str, params: dict[str, Any] | None = None
    ) -> list[Row]:
        """A named query in ``conn``'s transaction, or in one of its own from
        ``transaction()`` (which, on PostgreSQL, first gives a pooled connection
        back its own limits should a window have set a policy's)."""
        with self.transaction_or(conn) as c:
            return self._rows(c, name, params)

    def _run(self, conn: Any | None, name: str, params: dict[str, Any] | None = None) -> list[Row]:
        """A named query (always one statement) in ``conn``'s transaction, or
        without ``conn`` as a transaction of its own (an engine may send it
        without BEGIN and COMMIT: PostgreSQL does)."""
        return self._tx_rows(conn, name, params)

    def _one(self, conn: Any | None, name: str, params: dict[str, Any] | None = None) -> Row | None:
        found = self._run(conn, name, params)
        return found[0] if found else None

    def now(self, conn: Any | None = None) -> datetime:
        row = self._one(conn, "now")
        assert row is not None
        return self._time(row["now"])
