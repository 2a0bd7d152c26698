"""The storage seam: one Engine interface, one implementation per database.

Every method is named noun-first (job_claim, run_insert, schedule_advance,
key_active, ledger_insert, audit_append) after the named query it runs from the
engine's ``queries.sql``, takes typed parameters and returns plain values or the
small frozen rows of ``expiry.types`` (times as aware datetimes). The methods
below are written once against a few primitives that each engine provides: open
a transaction, run a named query (``_rows``, private: nothing outside
``engines/`` names a query), read a stored time (``_time``), turn a row into a
Job, and shape the batch parameters of ``job_insert_many``.

Methods that take ``conn`` run inside the caller's transaction (so a handler's
effect and its completion commit together); without it they open and commit
their own. A service that runs either way uses ``transaction_or(conn)``.
"""

from __future__ import annotations

import abc
import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from importlib import resources
from typing import Any

from ..defaults import MAX_PAYLOAD_BYTES
from ..errors import (
    AlreadyApplied,
    DatabaseUnavailable,
    LeaseLost,
    MigrationError,
    PayloadTooLarge,
    PermanentError,
    TransientError,
)
from ..timestamps import Storage
from ..types import (
    RESERVED_PREFIX,
    ActiveKey,
    ApiKey,
    AuditAction,
    AuditCount,
    AuditEvent,
    Column,
    CronCall,
    CronTarget,
    EnqueueResult,
    IdempotencyRecord,
    Index,
    Job,
    JobState,
    Layout,
    LedgerEntry,
    LockHolder,
    NewJob,
    Partition,
    PolicyTotals,
    QueueStats,
    Reference,
    Relation,
    Replica,
    Run,
    RunJobs,
    RunTotals,
    RunTurn,
    RunWait,
    Schedule,
    VacuumStats,
    WindowApply,
    WorkerSeen,
)

Row = dict[str, Any]

SCHEMA_DRIFT_KINDS = frozenset({"undefined_table", "undefined_column"})
"""Error kinds that say a table or column is missing: a policy's table renamed,
dropped or altered under a running process. The policy is quarantined (its
jobs wait, no attempt spent) rather than its jobs dead-lettered."""

OUTAGE_KINDS = frozenset(
    {
        "connection_lost",
        "admin_shutdown",
        "crash_shutdown",
        "cannot_connect_now",
        "too_many_connections",
        "read_only",
        "disk_full",
        "pooler_mismatch",
    }
)
"""Error kinds that say the database, not the job, is failing: down, restarting,
failed over (read-only), full, or behind a transaction pooler expiry was not
told of. A job they fail spends no attempt while the outage budget lasts
(queue/worker.py)."""

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(package: str, substitutions: dict[str, str] | None = None) -> dict[str, str]:
    """Read ``queries.sql`` of an engine package into {name: sql}."""
    text = resources.files(package).joinpath("queries.sql").read_text()
    for token, value in (substitutions or {}).items():
        text = text.replace(token, value)
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def load_migrations(package: str) -> list[tuple[int, str]]:
    """The numbered migrations of an engine, in order: [(1, sql), ...]."""
    folder = resources.files(package).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d{4})_\w+\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text()))
    return sorted(found)


_PAYLOAD_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


def check_payload(payload: dict[str, Any]) -> str:
    """Serialize a payload, refusing one over the limit. The text is ASCII (non-ASCII
    characters are escaped), so its length is its size in bytes."""
    text = _PAYLOAD_ENCODER.encode(payload)
    if len(text) > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"payload is {len(text)} bytes; the limit is {MAX_PAYLOAD_BYTES} bytes "
            "(256 KiB): carry identifiers, not records"
        )
    return text


def run_of(job: NewJob) -> str | None:
    """The run a job belongs to, stored as jobs.run_id: only expiry's own jobs
    (a reserved handler in a reserved queue) are part of runs. A run_id in an
    application's payload is the application's data, never run bookkeeping."""
    run_id = job.payload.get("run_id")
    mine = job.queue.startswith(RESERVED_PREFIX) and job.handler.startswith(RESERVED_PREFIX)
    return run_id if mine and isinstance(run_id, str) else None


def _scopes(value: Any) -> tuple[str, ...]:
    """Stored scopes (a JSON array, as text on SQLite) as a tuple."""
    return tuple(json.loads(value) if isinstance(value, str) else value)


def in_turns(jobs: Sequence[Job]) -> list[Job]:
    """Claimed jobs in the order a claim takes them: by priority, then the
    queues taking turns (every queue's first job before any queue's second),
    then run_at."""
    turn: dict[int, int] = {}
    seen: dict[str, int] = {}
    for job in sorted(jobs, key=lambda j: (j.priority, j.run_at, j.id)):
        turn[job.id] = seen[job.queue] = seen.get(job.queue, 0) + 1
    return sorted(jobs, key=lambda j: (j.priority, turn[j.id], j.run_at, j.id))


def enqueue_results(jobs: Sequence[NewJob], inserted: set[str]) -> list[EnqueueResult]:
    """Each job's result in the batch's order: enqueued when its key is one this
    batch inserted, the first time the batch names it."""
    seen: set[str] = set()
    results = []
    for job in jobs:
        results.append(EnqueueResult(job.key, job.key in inserted and job.key not in seen))
        seen.add(job.key)
    return results


MAX_INDEX_NAME = 60
"""index_statement's names are cut to this (PostgreSQL truncates past 63
bytes, MySQL refuses past 64 characters)."""


def index_leads(indexes: Sequence[Index], columns: Sequence[str]) -> bool:
    """Some index of ``indexes`` leads with ``columns``, in any order (a lookup
    by all of them can seek it). Column names compared without case (SQLite's
    and MySQL's are case-insensitive)."""
    wanted = {c.lower() for c in columns}
    return any(
        len(index.columns) >= len(wanted)
        and {c.lower() for c in index.columns[: len(wanted)]} == wanted
        for index in indexes
    )


def ledger_params(key: str, **fields: Any) -> dict[str, Any]:
    """The ledger_insert query's parameters: ``key`` and whichever fields are known."""
    named = ("policy", "run_id", "lo", "hi", "bounds", "blocked", "action", "worker")
    return {
        "key": key,
        **{f: fields.get(f) for f in named},
        "rows": fields.get("rows", 0),
        "kept": fields.get("kept", 0),
    }


class Engine(abc.ABC):
    """One database that holds both the application's tables and expiry's."""

    dialect: str
    url: str
    queries: dict[str, str]
    migrations: list[tuple[int, str]]

    window_timeouts: frozenset[str] = frozenset({"statement_timeout", "lock_timeout"})
    """The kinds of error (``classify``) that say a window's delete ran out of
    time: past the policy's statement_timeout, or waiting past its
    lock_timeout for a row that live traffic holds. A window whose attempts
    end in one is retried smaller, down to one row (cleanup/service.py)."""

    next_key_reads: bool = False
    """A locking range read (a window's delete) also waits on the lock of the
    first row past its range (InnoDB): a window cut before a held row must end
    one candidate earlier, and that candidate is kept with it (cleanup/service.py's
    _around_held)."""

    concurrent_writers: bool = True
    """Two connections can write at once. A worker claims its next batch while
    it runs one only where they can: on SQLite (one writer at a time) that
    claim would wait for the batch's own transactions."""

    # -- primitives each engine provides ------------------------------------

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

    # -- a policy's table: what cleanup/target.py builds its statements from -------------
    # Each engine says how its dialect names, binds, types and compares; the
    # statements themselves are written once, in cleanup/target.py.

    ledger_table: str
    """expiry's ledger, quoted, for the window's guard."""

    typed_columns: bool
    """True where a column's declared type decides what it holds (PostgreSQL);
    False where each value has its own storage class (SQLite), so the data is read."""

    @abc.abstractmethod
    def quote(self, identifier: str) -> str:
        """A validated identifier, schema-qualified or not, quoted by the driver's rules."""

    @abc.abstractmethod
    def placeholder(self, name: str) -> str:
        """A named parameter in the driver's style."""

    @abc.abstractmethod
    def escape(self, text: str) -> str:
        """Trusted SQL text (a policy's where) as it must appear in a statement that
        has parameters (psycopg doubles '%')."""

    @abc.abstractmethod
    def time_predicate(self, storage: Storage) -> tuple[str, str]:
        """The retention predicate's index bound and its guard for ``storage``
        (timestamps.py says why each holds), with {ts}, {p_cutoff} and {p_exact}."""

    @abc.abstractmethod
    def cutoff_params(self, storage: Storage, cutoff: datetime) -> dict[str, Any]:
        """The cutoff as the predicate of ``storage`` binds it."""

    @abc.abstractmethod
    def column_kind(self, declared: str) -> str:
        """A declared column type as "integer", "time" (a native time type) or "other"."""

    @abc.abstractmethod
    def table_columns(self, conn: Any, table: str) -> list[Column]:
        """The table's columns in order, each with whether an index leads with it."""

    @abc.abstractmethod
    def table_relation(self, conn: Any, table: str) -> Relation | None:
        """What ``table`` is, or None when it does not exist."""

    @abc.abstractmethod
    def placeholder_as(self, name: str, declared: str) -> str:
        """A named parameter read as a column of type ``declared`` (its type as
        table_columns gave it): where the driver binds text (a time window's
        positions on PostgreSQL), cast in the statement."""

    integer_type: str = "bigint"
    """The type a statement casts an integer to (MySQL: signed)."""

    integer_division: str = "/"
    """The operator that divides two integers into an integer (MySQL: div)."""

    recursive_scans: bool = True
    """The planner's loose index scan runs as one recursive statement. False:
    the planner asks for each window's first key in turn (MariaDB re-reads every
    earlier step of a recursive query at each step: 100 windows took 16 s)."""

    block_span: str | None = None
    """A window's range over the heap's row addresses, encoded block * 65536 +
    item in {p_lo} and {p_hi} (PostgreSQL's ctid); None where rows have no
    address a window can scan in order (SQLite)."""

    block_of_row: str | None = None
    """The expression that encodes a row's address as block_span reads it."""

    @abc.abstractmethod
    def table_layout(self, conn: Any, table: str, column: str) -> Layout | None:
        """The table's pages, rows and ``column``'s physical correlation from the
        planner's statistics; None where the engine keeps none (SQLite)."""

    @abc.abstractmethod
    def estimate_rows(self, conn: Any, statement: str, params: dict[str, Any]) -> int | None:
        """The planner's estimate of the rows ``statement`` returns (None: no planner estimates)."""

    @abc.abstractmethod
    def table_indexes(self, conn: Any, table: str) -> list[Index]:
        """The table's indexes, each with its columns in order (expressions left out)."""

    @abc.abstractmethod
    def table_references(self, conn: Any, table: str) -> list[Reference]:
        """The foreign keys of other tables (or of ``table`` itself) that reference
        ``table``, each with whether an index of the referencing table leads
        with its columns."""

    def index_statement(self, table: str, columns: Sequence[str]) -> str:
        """The CREATE INDEX that lets the database find the rows of ``table``
        by ``columns`` (a foreign key's), identifiers quoted, to copy and run."""
        name = re.sub(r"\W", "_", "_".join([table.split(".")[-1], *columns, "idx"]))
        name = name[:MAX_INDEX_NAME]
        listed = ", ".join(self.quote(c) for c in columns)
        return f"create index {self.quote(name)} on {self.quote(table)} ({listed})"

    @abc.abstractmethod
    def table_partitions(self, conn: Any, table: str) -> list[Partition]:
        """A partitioned table's partitions with their ranges ([] for any other table)."""

    @abc.abstractmethod
    def partition_remove(
        self, conn: Any, table: str, partition: Partition, *, drop: bool, lock_timeout_ms: int
    ) -> int | None:
        """Detach ``partition`` from ``table`` and, with ``drop``, drop it, in
        ``conn``'s transaction, waiting at most ``lock_timeout_ms`` for locks.
        Returns the rows it held, counted exactly while no row could be written
        to it; None when it is no longer a partition of ``table`` (a concurrent
        removal committed first), and then nothing is done."""

    # -- the database's health (the throttle reads these every check) -------------

    @abc.abstractmethod
    def health_wal_position(self, conn: Any) -> int | None:
        """The primary's current WAL position in bytes (None: no WAL to speak of,
        or a standby)."""

    @abc.abstractmethod
    def health_replicas(self, conn: Any) -> list[Replica]:
        """The standbys streaming from this primary ([] for none, or SQLite)."""

    @abc.abstractmethod
    def health_replay_lag(self, conn: Any) -> float | None:
        """On a standby: seconds its replay is behind what it received (0 when it
        has replayed all of it; infinite when it is behind but has replayed no
        transaction since it started, to date the lag by); None on a primary or
        SQLite."""

    @abc.abstractmethod
    def health_active_backends(self, conn: Any) -> int | None:
        """Client backends running a statement now, this one aside (None: SQLite)."""

    @abc.abstractmethod
    def table_vacuum_stats(self, conn: Any, table: str) -> VacuumStats | None:
        """The table's live and dead tuples and last vacuum (None: SQLite, or no
        statistics yet)."""

    @abc.abstractmethod
    def table_vacuum(self, conn: Any, table: str) -> None:
        """VACUUM (ANALYZE) the table; ``conn`` outside any transaction
        (``transaction(statement=True)``). SQLite: ANALYZE only (a VACUUM would
        rewrite the whole file)."""

    @abc.abstractmethod
    def explain(self, conn: Any, statement: str) -> None:
        """Plan ``statement`` without running it; raise the driver's error when it
        is not valid SQL, leaving the caller's transaction usable."""

    @abc.abstractmethod
    def window_apply(self, conn: Any, window: WindowApply) -> int | None:
        """Apply a window and book it, in ``conn``'s transaction (or, outside one,
        as a transaction of its own where the engine can): delete (or archive) its
        expired, unbooked rows under the policy's limits; with ``window.job``,
        complete the job; insert the ledger row with the rows taken, or, when none
        were taken and the key was booked before, audit a duplicate. Returns the
        rows taken, or None for a duplicate (nothing changed). Raises
        AlreadyApplied when rows were taken but the key was booked meanwhile:
        the transaction must roll back."""

    def _book_window(self, conn: Any, window: WindowApply, rows: int) -> int | None:
        """The end of a window run as statements in ``conn``'s transaction
        (SQLite, MySQL; PostgreSQL's window_apply does the same in plpgsql):
        complete its job, then book the ledger. Rows taken: the ledger row must
        be this delivery's (strict), else AlreadyApplied; none taken: a key
        booked before is a duplicate, audited. The rows taken, or None for a
        duplicate."""
        if window.job is not None:
            self.job_complete(window.job, conn)
        booked = self.ledger_insert(
            conn,
            window.key,
            strict=rows > 0,
            policy=window.policy,
            run_id=window.run_id,
            lo=window.lo,
            hi=window.hi,
            bounds=window.bounds,
            action=window.action,
            worker=window.worker,
            rows=rows,
        )
        if booked:
            return rows
        self.audit_append(
            conn,
            AuditAction.WINDOW_DUPLICATE,
            actor=window.worker or "worker",
            policy=window.policy,
            run_id=window.run_id,
            job_key=window.key,
        )
        return None

    # -- the clock ------------------------------------------------------------

    def now(self, conn: Any | None = None) -> datetime:
        row = self._one(conn, "now")
        assert row is not None
        return self._time(row["now"])

    # -- jobs -----------------------------------------------------------------

    def job_insert_many(
        self, jobs: Sequence[NewJob], conn: Any | None = None
    ) -> list[EnqueueResult]:
        if not jobs:
            return []
        payloads = [check_payload(job.payload) for job in jobs]
        with self.transaction_or(conn) as c:
            inserted = self._rows(c, "job_insert_many", self._insert_params(jobs, payloads))
            self._notify(c, {row["key"] for row in inserted if row["state"] == "available"}, jobs)
        return enqueue_results(jobs, {row["key"] for row in inserted})

    def _notify(self, conn: Any, due_keys: set[str], jobs: Sequence[NewJob]) -> None:  # noqa: B027
        """Hint listeners that due work arrived (PostgreSQL only; others poll)."""

    def job_claim(
        self,
        queues: Sequence[str],
        n: int,
        lease_seconds: float,
        owner: str,
        fair_share: bool = False,
        limits: Mapping[str, int] | None = None,
    ) -> list[Job]:
        """Lease up to ``n`` due jobs of ``queues``, by priority, the queues
        taking turns (in_turns), then run_at. ``limits``: at most this many
        from a queue (a paced policy's queue: 1). ``fair_share``: at most half
        of the due jobs seen, rounded up."""
        limits = limits or {}
        params = {
            "queues": self._list(queues),
            "limits": self._list([limits.get(q, n) for q in queues]),
            "n": n,
            "lease": lease_seconds,
            "owner": owner,
            "fair_share": fair_share,
        }
        return in_turns([self._job(row) for row in self._claim_rows(params)])

    def _claim_rows(self, params: dict[str, Any]) -> list[Row]:
        """The claim's statement, as a transaction of its own."""
        return self._run(None, "job_claim", params)

    def job_heartbeat(self, job: Job, lease_seconds: float) -> bool:
        params = {"id": job.id, "token": job.lease_token, "lease": lease_seconds}
        return self._one(None, "job_heartbeat", params) is not None

    def job_complete(self, job: Job, conn: Any | None = None) -> None:
        """Complete a job; raises LeaseLost (so the caller's transaction rolls back)
        when the lease has moved on."""
        if self._one(conn, "job_complete", {"id": job.id, "token": job.lease_token}) is None:
            raise LeaseLost(f"job {job.key}: lease lost before completion")

    def job_complete_many(self, jobs: Sequence[Job], conn: Any) -> None:
        """Complete jobs run together in ``conn``'s transaction; raises LeaseLost
        (so that all of them roll back) when any lease has moved on."""
        done = {row["id"] for row in self._rows(conn, "job_complete_many", self._leases(jobs))}
        lost = [job.key for job in jobs if job.id not in done]
        if lost:
            raise LeaseLost(f"jobs {', '.join(lost)}: lease lost before completion")

    def job_ack_many(self, jobs: Sequence[Job]) -> set[int]:
        """Complete those of ``jobs`` whose leases still hold, as a transaction of
        its own (one statement on PostgreSQL: no BEGIN, no COMMIT): the ids it
        completed. The others are left to whoever holds them now."""
        return {row["id"] for row in self._run(None, "job_complete_many", self._leases(jobs))}

    def _leases(self, jobs: Sequence[Job]) -> dict[str, Any]:
        """The jobs' ids and lease tokens, bound as two lists."""
        return {
            "ids": self._list([job.id for job in jobs]),
            "tokens": self._list([job.lease_token or "" for job in jobs]),
        }

    def job_fail(
        self,
        job: Job,
        error: str,
        kind: str,
        retry_delay: float | None,
        *,
        unspent_within: float | None = None,
    ) -> JobState | None:
        """Record a failure. ``retry_delay`` None means permanent.
        ``unspent_within``: a transient failure that is not the job's (an
        outage, a window retried smaller) gives its attempt back while the
        streak of such failures began less than this many seconds ago (None:
        it spends one, as any other failure). Returns the new state, or None
        when the caller no longer held the lease."""
        params = {
            "id": job.id,
            "token": job.lease_token,
            "retry": retry_delay is not None,
            "delay": retry_delay or 0.0,
            "error": error[:4000],
            "kind": kind,
            "unspent": retry_delay is not None and unspent_within is not None,
            "budget": unspent_within or 0.0,
        }
        row = self._one(None, "job_fail", params)
        return JobState(row["state"]) if row else None

    def job_release(
        self, job: Job, delay: float = 0.0, conn: Any | None = None, *, reason: str | None = None
    ) -> bool:
        """Give a claimed job back, its attempt unspent, due in ``delay`` seconds.
        ``reason``: why it waits (a snooze), kept with the time its wait began;
        None (a shutdown, a pause) clears both."""
        params = {"id": job.id, "token": job.lease_token, "delay": delay, "reason": reason}
        return self._one(conn, "job_release", params) is not None

    def job_wake(self, key: str, *, conn: Any | None = None) -> bool:
        """Make the snoozed job ``key`` due now; False when it was not snoozed."""
        return bool(self._tx_rows(conn, "job_wake", {"key": key}))

    def job_rescue(self) -> list[Row]:
        with self.maintenance_transaction() as conn:
            return self._rows(conn, "job_rescue")

    def job_redrive(
        self, keys: Sequence[str] = (), *, all: bool = False, policy: str | None = None
    ) -> list[Row]:
        params = {"keys": self._list(keys), "all": all, "policy": policy}
        with self.transaction() as conn:
            rows = self._rows(conn, "job_redrive", params)
            runs = sorted({row["run_id"] for row in rows if row["run_id"] is not None})
            if runs:  # their runs are open again until the jobs end
                self._rows(conn, "run_reopen", {"ids": self._list(runs)})
            return rows

    def job_discard(self, keys: Sequence[str]) -> list[Row]:
        with self.transaction() as conn:
            return self._rows(conn, "job_discard", {"keys": self._list(keys)})

    def job_get(self, key: str, conn: Any | None = None) -> Job | None:
        row = self._one(conn, "job_get", {"key": key})
        return self._job(row) if row else None

    def lock_holders(self, table: str) -> list[LockHolder]:
        """The other sessions holding locks on ``table`` now, oldest transaction
        first, at most five: on PostgreSQL those with a lock on the relation; on
        MySQL and MariaDB every transaction holding row locks (a lock's table is
        named there only while someone waits for it); none on SQLite. Read on a
        connection of its own, right after a window's lock wait ran out, to
        name whom it waited behind."""
        with self.transaction() as conn:
            rows = self._rows(conn, "lock_holders", {"table": table})
        return [
            LockHolder(
                pid=int(r["pid"]),
                application=str(r["application"]),
                state=str(r["state"]),
                seconds=None if r["seconds"] is None else float(r["seconds"]),
                query=" ".join(str(r["query"]).split()),
            )
            for r in rows
        ]

    def job_queues(self, ids: Sequence[int]) -> dict[int, str]:
        """The queue of each job of ``ids`` that exists."""
        with self.transaction() as conn:
            rows = self._rows(conn, "job_queues", {"ids": self._list(ids)})
        return {int(row["id"]): str(row["queue"]) for row in rows}

    def job_list(self, state: JobState, queue: str | None = None, limit: int = 100) -> list[Job]:
        with self.transaction() as conn:
            found = self._rows(
                conn, "job_list", {"state": state.value, "queue": queue, "limit": limit}
            )
        return [self._job(row) for row in found]

    def job_prune(self, older_than_seconds: float, limit: int = 10_000) -> int:
        with self.transaction() as conn:
            cur = conn.execute(
                self.queries["job_prune"],
                self._bind({"age": older_than_seconds, "limit": limit}),
            )
            return int(cur.rowcount)

    def ledger_prune(self, older_than_seconds: float, limit: int = 10_000) -> tuple[int, int]:
        """Delete up to ``limit`` ledger rows of runs finished more than
        ``older_than_seconds`` ago, then up to ``limit`` such runs with no ledger
        row left: (ledger rows, runs) deleted. Never a row of an open run."""
        params = self._bind({"age": older_than_seconds, "limit": limit})
        with self.transaction() as conn:
            ledger = int(conn.execute(self.queries["ledger_prune"], params).rowcount)
        with self.transaction() as conn:
            runs = int(conn.execute(self.queries["run_prune"], params).rowcount)
        return ledger, runs

    def _bind(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    def job_pending_count(
        self, queue: str | None = None, *, due_only: bool = False, conn: Any | None = None
    ) -> int:
        """Jobs not yet final; with ``due_only``, those running or due now."""
        row = self._one(conn, "job_pending_count", {"queue": queue, "due_only": due_only})
        return int(row["n"]) if row else 0

    def job_pending_by_queue(self) -> dict[str, tuple[int, int]]:
        """Per application queue (not expiry's own) holding jobs not yet final:
        (jobs, bytes of their messages as stored)."""
        with self.transaction() as conn:
            rows = self._rows(conn, "job_pending_by_queue")
        return {str(r["queue"]): (int(r["n"]), int(r["bytes"])) for r in rows}

    def job_stats(self) -> QueueStats:
        with self.transaction() as conn:
            counts = self._rows(conn, "job_counts")
            oldest = self._rows(conn, "job_oldest_due")
            running = self._rows(conn, "job_running")
            retries = self._rows(conn, "job_retries_by_kind")
        by_state: dict[str, dict[str, int]] = {}
        for row in counts:
            by_state.setdefault(row["queue"], {})[row["state"]] = int(row["n"])
        return QueueStats(
            by_state=by_state,
            oldest_due_seconds={row["queue"]: max(0.0, float(row["age"])) for row in oldest},
            running=[(row["queue"], row["key"], float(row["held"])) for row in running],
            retries_by_kind={row["kind"]: int(row["n"]) for row in retries},
            dead=sum(states.get("dead", 0) for states in by_state.values()),
        )

    # -- ledger and audit ---------------------------------------------------------

    def ledger_insert(
        self,
        conn: Any,
        key: str,
        *,
        strict: bool = False,
        policy: str | None = None,
        run_id: str | None = None,
        lo: int | None = None,
        hi: int | None = None,
        bounds: str | None = None,
        blocked: str | None = None,
        action: str | None = None,
        worker: str | None = None,
        rows: int = 0,
        kept: int = 0,
    ) -> bool:
        """True if this transaction now owns ``key``; False if it committed before.
        ``rows``: how many rows the operation affected, when that is known already;
        ``kept``: how many expired rows it kept (``blocked`` says why).
        ``strict``: the caller has acted already and must own ``key``; should it
        not, AlreadyApplied is raised, so that its transaction rolls back.
        ``bounds``: a range that is not two integer keys (a time window's
        positions, a partition's name); ``blocked``: what a foreign key kept
        the operation from deleting, and why."""
        params = ledger_params(
            key,
            policy=policy,
            run_id=run_id,
            lo=lo,
            hi=hi,
            bounds=bounds,
            blocked=blocked,
            action=action,
            worker=worker,
            rows=rows,
            kept=kept,
        )
        booked = bool(self._rows(conn, "ledger_insert", params))
        if strict and not booked:
            raise AlreadyApplied(f"{key}: a concurrent delivery booked it first")
        return booked

    def ledger_keep(self, conn: Any, key: str, kept: int, blocked: str) -> None:
        """Record on ``key``'s ledger row, booked in ``conn``'s transaction, the
        ``kept`` expired rows it did not take and why (``blocked``): rows that
        other tables' rows reference, skipped by the window's delete."""
        self._run(conn, "ledger_keep", {"key": key, "kept": kept, "blocked": blocked})

    def ledger_get(self, key: str, *, conn: Any | None = None) -> LedgerEntry | None:
        """The ledger row of ``key``, or None when no operation booked it."""
        row = self._one(conn, "ledger_get", {"key": key})
        return None if row is None else self._ledger_entry(row)

    def ledger_list(
        self,
        policy: str,
        since: datetime | None = None,
        *,
        limit: int = 100_000,
        conn: Any | None = None,
    ) -> list[LedgerEntry]:
        """The ledger rows of ``policy``'s runs booked at or after ``since``
        (None: every one kept), oldest first, at most ``limit``: the evidence of
        deletion."""
        params = {
            "policy": policy,
            "since": None if since is None else self.time_param(since),
            "limit": limit,
        }
        return [self._ledger_entry(row) for row in self._run(conn, "ledger_list", params)]

    def _ledger_entry(self, row: Row) -> LedgerEntry:
        return LedgerEntry(
            key=row["key"],
            policy=row["policy"],
            run_id=row["run_id"],
            lo=row["lo"],
            hi=row["hi"],
            bounds=row["bounds"],
            blocked=row["blocked"],
            kept=int(row.get("rows_kept") or 0),
            action=row["action"],
            rows_affected=int(row["rows_affected"]),
            worker=row["worker"],
            applied_at=self._time(row["applied_at"]),
        )

    def audit_append(
        self,
        conn: Any | None,
        action: AuditAction,
        *,
        actor: str,
        policy: str | None = None,
        run_id: str | None = None,
        job_key: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        params = {
            "actor": actor,
            "action": str(action),
            "policy": policy,
            "run_id": run_id,
            "job_key": job_key,
            "detail": json.dumps(detail or {}, default=str),
        }
        with self.transaction_or(conn) as c:
            self._rows(c, "audit_append", params)

    def audit_list(
        self, policy: str | None = None, limit: int = 100, *, conn: Any | None = None
    ) -> list[AuditEvent]:
        """The newest ``limit`` audit events, newest first; of one policy when given."""
        found = self._tx_rows(conn, "audit_list", {"policy": policy, "limit": limit})
        return [self._as_audit_event(row) for row in found]

    def _as_audit_event(self, row: Row) -> AuditEvent:
        detail = row["detail"]
        return AuditEvent(
            id=int(row["id"]),
            at=self._time(row["at"]),
            actor=row["actor"],
            action=row["action"],
            policy=row["policy"],
            run_id=row["run_id"],
            job_key=row["job_key"],
            # jsonb arrives decoded (PostgreSQL); SQLite keeps the JSON text.
            detail=json.loads(detail) if isinstance(detail, str) else detail,
        )

    def audit_counts(self, *, conn: Any | None = None) -> list[AuditCount]:
        """Audited events by action and policy (a policy of None: events of none)."""
        return [
            AuditCount(row["action"], row["policy"], int(row["n"]))
            for row in self._tx_rows(conn, "audit_counts")
        ]

    # -- runs -----------------------------------------------------------------------

    def run_insert(
        self,
        run_id: str,
        policy: str,
        cutoff: datetime,
        opened_by: str,
        *,
        conn: Any | None = None,
    ) -> bool:
        """Open a run; False when the run ``run_id`` (policy:cutoff) exists already."""
        params = {
            "id": run_id,
            "policy": policy,
            "cutoff": self.time_param(cutoff),
            "opened_by": opened_by,
        }
        return bool(self._tx_rows(conn, "run_insert", params))

    def run_get(self, run_id: str, *, conn: Any | None = None) -> Run | None:
        found = self._tx_rows(conn, "run_get", {"id": run_id})
        return self._as_run(found[0]) if found else None

    def run_list(
        self, policy: str | None = None, limit: int = 20, *, conn: Any | None = None
    ) -> list[Run]:
        """The newest ``limit`` runs, newest opened first; of one policy when given."""
        found = self._tx_rows(conn, "run_list", {"policy": policy, "limit": limit})
        return [self._as_run(row) for row in found]

    def _as_run(self, row: Row) -> Run:
        return Run(
            id=row["id"],
            policy=row["policy"],
            cutoff=self._time(row["cutoff"]),
            opened_by=row["opened_by"],
            state=row["state"],
            windows_planned=int(row["windows_planned"]),
            opened_at=self._time(row["opened_at"]),
            planned_at=self._maybe_time(row["planned_at"]),
            finished_at=self._maybe_time(row["finished_at"]),
            cancelled_at=self._maybe_time(row["cancelled_at"]),
            cancelled_by=row["cancelled_by"],
            superseded_by=row.get("superseded_by"),
            stalled_at=self._maybe_time(row.get("stalled_at")),
        )

    def run_add_windows(
        self, run_id: str, windows: int, *, done: bool, conn: Any | None = None
    ) -> bool:
        """Count the windows a planning page is about to queue; ``done``: it is the
        last page, the run moves from planning to running. False when the run
        was cancelled: queue nothing (the run's row is locked till commit, so a
        cancel either sees this page's jobs or this page sees the cancel)."""
        params = {"id": run_id, "windows": windows, "done": done}
        return bool(self._tx_rows(conn, "run_add_windows", params))

    def run_cancel(
        self,
        run_id: str,
        actor: str,
        *,
        superseded_by: str | None = None,
        conn: Any | None = None,
    ) -> list[str] | None:
        """Cancel a run not yet finished: its planning stops and its waiting jobs
        are cancelled (their keys returned); jobs running now finish, and the
        run finishes after them. ``superseded_by``: the later run of the policy
        that takes its place. None: no such run, or it finished or was
        cancelled already."""
        params = {"id": run_id, "actor": actor, "superseded_by": superseded_by}
        with self.transaction_or(conn) as tx:
            if not self._rows(tx, "run_cancel", params):
                return None
            return [row["key"] for row in self._rows(tx, "run_cancel_jobs", {"id": run_id})]

    def run_finish(self, run_id: str, *, conn: Any | None = None) -> bool:
        """Finish a planned run none of whose jobs is pending; True if it did now
        (and, on PostgreSQL, hint ``expiry_runs`` listeners at commit)."""
        return self._one(conn, "run_finish", {"id": run_id}) is not None

    def run_finish_idle(self, *, conn: Any | None = None) -> list[str]:
        """Finish every planned run with nothing pending; the ids finished now."""
        return [row["id"] for row in self._tx_rows(conn, "run_finish_idle")]

    def run_jobs(self, run_id: str, *, conn: Any | None = None) -> list[RunJobs]:
        """A run's jobs counted by handler and state, in no particular order."""
        return [
            RunJobs(
                handler=row["handler"],
                state=row["state"],
                n=int(row["n"]),
                attempts=int(row["attempts"]),
                failures=int(row["failures"]),
                redelivered=int(row.get("redelivered") or 0),
            )
            for row in self._tx_rows(conn, "run_jobs", {"id": run_id})
        ]

    def run_ledger(self, run_id: str, *, conn: Any | None = None) -> RunTotals:
        """What a run has applied, from the ledger (zeros before its first window);
        ``blocked``: the expired rows its windows kept (foreign keys)."""
        row = self._one(conn, "run_ledger", {"id": run_id}) or {"windows": 0, "rows": 0}
        return RunTotals(
            windows=int(row["windows"]), rows=int(row["rows"]), blocked=int(row.get("blocked") or 0)
        )

    def run_duplicates(self, run_id: str, *, conn: Any | None = None) -> int:
        """Duplicate deliveries a run's windows absorbed (audited window.duplicate)."""
        row = self._one(conn, "run_duplicates", {"id": run_id})
        return int(row["n"]) if row else 0

    def run_turns(self, policy: str, *, conn: Any | None = None) -> list[RunTurn]:
        """The policy's open runs (not finished, not cancelled) in their turn:
        by cutoff, then id."""
        return [
            RunTurn(
                id=row["id"],
                cutoff=self._time(row["cutoff"]),
                started=bool(row["started"]),
                pending=int(row["pending"]),
                active=int(row["active"]),
            )
            for row in self._tx_rows(conn, "run_turns", {"policy": policy})
        ]

    def run_waits(self, run_id: str, *, conn: Any | None = None) -> list[RunWait]:
        """What the run's pending jobs wait for, by state and reason."""
        return [
            RunWait(
                state=row["state"],
                reason=row["reason"],
                n=int(row["n"]),
                error=row["error"],
                since=self._time(row["since"]),
                next_at=self._time(row["next_at"]),
            )
            for row in self._tx_rows(conn, "run_waits", {"id": run_id})
        ]

    def run_mark_stalled(
        self, policy: str, seconds: float, *, conn: Any | None = None
    ) -> list[tuple[str, datetime]]:
        """Mark the policy's runs open longer than ``seconds`` as stalled, each
        once: (id, opened_at) of those marked now."""
        params = {"policy": policy, "seconds": seconds}
        rows = self._tx_rows(conn, "run_mark_stalled", params)
        return [(row["id"], self._time(row["opened_at"])) for row in rows]

    def run_open_oldest(self, *, conn: Any | None = None) -> dict[str, datetime]:
        """Per policy with a run not yet finished: when the oldest was opened."""
        rows = self._tx_rows(conn, "run_open_oldest")
        return {row["policy"]: self._time(row["opened_at"]) for row in rows}

    def policy_totals(self, *, conn: Any | None = None) -> list[PolicyTotals]:
        """Windows and rows applied per policy, over the whole ledger."""
        return [
            PolicyTotals(row["policy"], int(row["windows"]), int(row["rows"]))
            for row in self._tx_rows(conn, "policy_totals")
        ]

    # -- schedules ----------------------------------------------------------------

    def schedule_register(self, policy: str, now: datetime, *, conn: Any | None = None) -> None:
        """First sight of a policy's schedule: fires count from ``now``. A schedule
        known already is left as it is."""
        params = {"policy": policy, "now": self.time_param(now)}
        self._tx_rows(conn, "schedule_register", params)

    def schedule_list(self, *, conn: Any | None = None) -> list[Schedule]:
        """Every schedule's state, by policy name."""
        return [
            Schedule(
                policy=row["policy"],
                paused=bool(row["paused"]),
                last_fire_at=self._maybe_time(row["last_fire_at"]),
                updated_at=self._time(row["updated_at"]),
                last_fire_stored=row["last_fire_at"],
                paused_by=row["paused_by"],
            )
            for row in self._tx_rows(conn, "schedule_list")
        ]

    def schedule_advance(
        self, schedule: Schedule, fire: datetime, *, conn: Any | None = None
    ) -> bool:
        """Claim the fire times after ``schedule.last_fire_at``, up to ``fire``: a
        compare-and-set on the last fire as read. False when another scheduler
        moved it first, when the schedule is paused, or when ``fire`` is not later."""
        params = {
            "policy": schedule.policy,
            "last": schedule.last_fire_stored,
            "fire": self.time_param(fire),
        }
        return bool(self._tx_rows(conn, "schedule_advance", params))

    def schedule_set_paused(
        self, policy: str, paused: bool, *, by: str | None = None, conn: Any | None = None
    ) -> None:
        """Pause or resume a policy's schedule (registering it when unknown);
        ``by`` says who paused it ("throttle": a critical reading, whose stop holds
        the policy's windows too). Resuming clears it."""
        params = {"policy": policy, "paused": paused, "by": by if paused else None}
        self._tx_rows(conn, "schedule_set_paused", params)

    def schedule_version(self, *, conn: Any | None = None) -> tuple[datetime, int]:
        """(the latest change, how many schedules and cron targets): different once
        another process pauses, resumes or registers a schedule, or creates,
        deletes, pauses or fires a cron target."""
        row = self._one(conn, "schedule_version")
        assert row is not None  # an aggregate: always one row
        return self._time(row["version"]), int(row["n"])

    # -- cron targets and their calls ---------------------------------------------------

    def cron_insert(
        self,
        name: str,
        http_url: str,
        schedule: str,
        timezone: str,
        secret: str,
        *,
        owner: str | None = None,
        conn: Any | None = None,
    ) -> bool:
        """Create a cron target whose fires count from now, belonging to the key
        ``owner`` (None: to admin keys only); False when ``name`` exists."""
        params = {
            "owner": owner,
            "name": name,
            "http_url": http_url,
            "schedule": schedule,
            "timezone": timezone,
            "secret": secret,
        }
        return bool(self._tx_rows(conn, "cron_insert", params))

    def cron_list(self, *, conn: Any | None = None) -> list[CronTarget]:
        """Every cron target, by name."""
        return [self._as_cron_target(row) for row in self._tx_rows(conn, "cron_list")]

    def cron_get(self, name: str, *, conn: Any | None = None) -> CronTarget | None:
        row = self._one(conn, "cron_get", {"name": name})
        return self._as_cron_target(row) if row else None

    def _as_cron_target(self, row: Row) -> CronTarget:
        return CronTarget(
            name=row["name"],
            http_url=row["http_url"],
            schedule=row["schedule"],
            timezone=row["timezone"],
            secret=row["secret"],
            paused=bool(row["paused"]),
            last_fire_at=self._maybe_time(row["last_fire_at"]),
            created_at=self._time(row["created_at"]),
            updated_at=self._time(row["updated_at"]),
            last_fire_stored=row["last_fire_at"],
            owner=row["owner"],
        )

    def cron_delete(self, name: str, *, conn: Any | None = None) -> bool:
        """Delete a cron target (its calls stay); False when there was none."""
        return self._one(conn, "cron_delete", {"name": name}) is not None

    def cron_set_paused(self, name: str, paused: bool, *, conn: Any | None = None) -> bool:
        """Pause or resume a cron target; False when there is none of that name."""
        return self._one(conn, "cron_set_paused", {"name": name, "paused": paused}) is not None

    def cron_update(
        self,
        name: str,
        http_url: str,
        schedule: str,
        timezone: str,
        *,
        conn: Any | None = None,
    ) -> bool:
        """Set a cron target's URL, schedule and time zone; False when there is
        none of that name. Its secret, owner and fires so far stay."""
        params = {"name": name, "http_url": http_url, "schedule": schedule, "timezone": timezone}
        return self._one(conn, "cron_update", params) is not None

    def cron_advance(self, target: CronTarget, fire: datetime, *, conn: Any | None = None) -> bool:
        """Claim ``fire`` for a target: a compare-and-set on its last fire as read
        (as schedule_advance)."""
        params = {
            "name": target.name,
            "fire": self.time_param(fire),
            "last": target.last_fire_stored,
        }
        return bool(self._tx_rows(conn, "cron_advance", params))

    def cron_call_insert(
        self,
        name: str,
        fire_time: datetime,
        attempt: int,
        *,
        status: int | None,
        duration_ms: float | None,
        response: str | None,
        error: str | None,
        conn: Any | None = None,
    ) -> None:
        """Record one call's outcome."""
        params = {
            "name": name,
            "fire_time": self.time_param(fire_time),
            "attempt": attempt,
            "status": status,
            "duration_ms": duration_ms,
            "response": response,
            "error": error,
        }
        self._tx_rows(conn, "cron_call_insert", params)

    def cron_calls(self, name: str, limit: int = 50, *, conn: Any | None = None) -> list[CronCall]:
        """A target's newest ``limit`` calls, newest first."""
        return [
            CronCall(
                id=int(row["id"]),
                name=row["name"],
                fire_time=self._time(row["fire_time"]),
                attempt=int(row["attempt"]),
                status=row["status"],
                duration_ms=row["duration_ms"],
                response=row["response"],
                error=row["error"],
                at=self._time(row["at"]),
            )
            for row in self._tx_rows(conn, "cron_calls", {"name": name, "limit": limit})
        ]

    # -- the workers' roll -----------------------------------------------------------

    def worker_seen(
        self,
        name: str,
        *,
        host: str,
        pid: int,
        threads: int,
        queues: Sequence[str],
        resting: Mapping[str, float],
        holding: int,
        health: Mapping[str, Any] | None = None,
        conn: Any | None = None,
    ) -> None:
        """A worker's roll call (every heartbeat): stored or refreshed, with its
        policies' throttles (health/database.py's snapshot), and any worker not seen for
        a day forgotten."""
        params = {
            "name": name,
            "host": host,
            "pid": pid,
            "threads": threads,
            "queues": json.dumps(list(queues)),
            "resting": json.dumps({q: round(s, 3) for q, s in resting.items()}),
            "holding": holding,
            "health": json.dumps(health or {}),
        }
        with self.transaction_or(conn) as tx:
            self._rows(tx, "worker_forget")
            self._rows(tx, "worker_seen", params)

    def worker_gone(self, name: str, *, conn: Any | None = None) -> None:
        """A worker that stopped cleanly leaves the roll."""
        self._tx_rows(conn, "worker_gone", {"name": name})

    def worker_list(self, *, conn: Any | None = None) -> list[WorkerSeen]:
        """The roll, newest first."""

        def loaded(value: Any) -> Any:
            return json.loads(value) if isinstance(value, str) else value

        return [
            WorkerSeen(
                name=row["name"],
                host=row["host"],
                pid=int(row["pid"]),
                threads=int(row["threads"]),
                queues=list(loaded(row["queues"])),
                resting=dict(loaded(row["resting"])),
                holding=int(row["holding"]),
                health=dict(loaded(row["health"])),
                started_at=self._time(row["started_at"]),
                seen_at=self._time(row["seen_at"]),
                seen_seconds_ago=max(0.0, float(row["seen_seconds_ago"])),
            )
            for row in self._tx_rows(conn, "worker_list")
        ]

    # -- API keys -------------------------------------------------------------------

    def key_insert(
        self,
        name: str,
        key_hash: str,
        scopes: Sequence[str] = ("admin",),
        *,
        conn: Any | None = None,
    ) -> bool:
        """Store a new key's hash and scopes; False when a key of that name exists
        (revoked or not)."""
        params = {"name": name, "hash": key_hash, "scopes": json.dumps(list(scopes))}
        return bool(self._tx_rows(conn, "key_insert", params))

    def key_list(self, *, conn: Any | None = None) -> list[ApiKey]:
        """Every key, revoked ones included, by name; never a secret or hash."""
        return [
            ApiKey(
                row["name"],
                self._time(row["created_at"]),
                self._maybe_time(row["revoked_at"]),
                _scopes(row["scopes"]),
            )
            for row in self._tx_rows(conn, "key_list")
        ]

    def key_set_scopes(self, name: str, scopes: Sequence[str], *, conn: Any | None = None) -> bool:
        """Replace the scopes of a key in force; False when there is none of that name."""
        params = {"name": name, "scopes": json.dumps(list(scopes))}
        return bool(self._tx_rows(conn, "key_set_scopes", params))

    def key_revoke(self, name: str, *, conn: Any | None = None) -> bool:
        """Revoke a key; False when there is no key of that name still in force."""
        return bool(self._tx_rows(conn, "key_revoke", {"name": name}))

    def key_active(self, *, conn: Any | None = None) -> dict[str, ActiveKey]:
        """{name: its hash and scopes} of every key still in force."""
        return {
            row["name"]: ActiveKey(row["hash"], _scopes(row["scopes"]))
            for row in self._tx_rows(conn, "key_active")
        }

    # -- idempotency ------------------------------------------------------------------

    def idempotency_begin(
        self, api_key: str, key: str, request_hash: str, *, conn: Any | None = None
    ) -> bool:
        """Record a request under (api_key, key) as in flight; False when a record
        exists already (expired or not: see idempotency_get)."""
        params = {"api_key": api_key, "key": key, "hash": request_hash}
        return bool(self._tx_rows(conn, "idempotency_begin", params))

    def idempotency_get(
        self, api_key: str, key: str, *, conn: Any | None = None
    ) -> IdempotencyRecord | None:
        """The record of (api_key, key) if younger than 24 hours."""
        row = self._one(conn, "idempotency_get", {"api_key": api_key, "key": key})
        if row is None:
            return None
        status = row["status"]
        return IdempotencyRecord(
            row["request_hash"], None if status is None else int(status), row["body"]
        )

    def idempotency_finish(
        self, api_key: str, key: str, status: int, body: str, *, conn: Any | None = None
    ) -> None:
        """Store the first response (status and JSON body text) for replay."""
        params = {"api_key": api_key, "key": key, "status": status, "body": body}
        self._one(conn, "idempotency_finish", params)

    def idempotency_forget(self, api_key: str, key: str, *, conn: Any | None = None) -> None:
        """Drop the record of (api_key, key), and every record over 24 hours old."""
        self._one(conn, "idempotency_forget", {"api_key": api_key, "key": key})


def classify_exception(exc: BaseException) -> tuple[bool, str] | None:
    """Errors every engine classifies the same way: (transient, kind)."""
    if isinstance(exc, PermanentError):
        return False, type(exc).__name__
    if isinstance(exc, TransientError):
        return True, exc.kind or type(exc).__name__
    if isinstance(exc, DatabaseUnavailable):
        return True, "connection_lost"
    return None
