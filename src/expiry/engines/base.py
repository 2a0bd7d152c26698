"""The storage seam: one Engine interface, one implementation per database.

Every method is named noun-first (job_claim, ledger_insert, audit_append) and
runs a named query from the engine's ``queries.sql``. The methods below are
written once against four primitives that each engine provides: open a
transaction, run a named query, turn a row into a Job, and shape the batch
parameters of ``job_insert_many``. Methods that take ``conn`` run inside the
caller's transaction (so a handler's effect and its completion commit
together); without it they open and commit their own.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from importlib import resources
from typing import Any

from ..defaults import MAX_PAYLOAD_BYTES
from ..errors import AlreadyApplied, LeaseLost, MigrationError, PayloadTooLarge
from ..types import EnqueueResult, Job, JobState, NewJob, QueueStats

Row = dict[str, Any]
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


def ledger_params(key: str, **fields: Any) -> dict[str, Any]:
    """The ledger_insert query's parameters: ``key`` and whichever fields are known."""
    named = ("policy", "run_id", "lo", "hi", "action", "worker")
    return {"key": key, **{f: fields.get(f) for f in named}, "rows": fields.get("rows", 0)}


class Engine(abc.ABC):
    """One database that holds both the application's tables and expiry's."""

    dialect: str
    url: str
    queries: dict[str, str]
    migrations: list[tuple[int, str]]

    # -- primitives each engine provides ------------------------------------

    @abc.abstractmethod
    @contextmanager
    def transaction(self, *, pipelined: bool = False, statement: bool = False) -> Iterator[Any]:
        """A driver connection inside a transaction, committed on success.

        ``pipelined``: where the driver can, statements are queued and sent
        together when a result is read, BEGIN with the first of them and COMMIT
        with the last (PostgreSQL's pipeline mode); an error of a statement whose
        result is never read surfaces at commit. Others ignore it.

        ``statement``: where the engine can, the connection comes outside any
        transaction, so that one statement is its own transaction, sent without
        BEGIN or COMMIT (PostgreSQL's autocommit); work of several statements
        goes in ``atomic(conn)``. Others give an ordinary transaction."""

    @contextmanager
    def atomic(self, conn: Any) -> Iterator[Any]:
        """Statements that must commit together, on a connection from
        ``transaction()``: in statement mode, a transaction of their own;
        otherwise they are in the caller's already."""
        yield conn

    def session_limits(self, conn: Any, lock_timeout: str, statement_timeout: str) -> None:
        """Bind the statements that follow on ``conn`` by these limits, where the
        engine has them (PostgreSQL); values like '2000ms'. SQLite has none: its
        single writer waits out busy_timeout instead."""
        return None

    @abc.abstractmethod
    def rows(self, conn: Any, name: str, params: dict[str, Any] | None = None) -> list[Row]:
        """Run a named query and return its rows as dicts."""

    @abc.abstractmethod
    def _job(self, row: Row) -> Job: ...

    @abc.abstractmethod
    def _insert_params(self, jobs: Sequence[NewJob], payloads: list[str]) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _list(self, values: Sequence[Any]) -> Any:
        """A list of strings or numbers as this driver binds it for ``= any``/``in``."""

    @abc.abstractmethod
    def _time(self, value: Any) -> datetime: ...

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
        import time

        time.sleep(timeout)

    def wait_for_runs(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds, returning early on a hint that a run
        finished (PostgreSQL's LISTEN; engines without hints sleep)."""
        import time

        time.sleep(timeout)

    def check_schema_version(self, current: int) -> None:
        latest = self.migrations[-1][0]
        if current > latest:
            raise MigrationError(
                f"the database is at expiry schema version {current}, newer than this "
                f"expiry knows ({latest}); upgrade expiry before running it here"
            )

    @contextmanager
    def _tx(self, conn: Any | None) -> Iterator[Any]:
        if conn is not None:
            yield conn
        else:
            with self.transaction() as own:
                yield own

    def run(self, conn: Any | None, name: str, params: dict[str, Any] | None = None) -> list[Row]:
        """A named query (always one statement) in ``conn``'s transaction, or
        without ``conn`` as a transaction of its own."""
        with self._tx(conn) as c:
            return self.rows(c, name, params)

    def one(self, conn: Any | None, name: str, params: dict[str, Any] | None = None) -> Row | None:
        found = self.run(conn, name, params)
        return found[0] if found else None

    # -- the clock ------------------------------------------------------------

    def now(self, conn: Any | None = None) -> datetime:
        row = self.one(conn, "now")
        assert row is not None
        return self._time(row["now"])

    # -- jobs -----------------------------------------------------------------

    def job_insert_many(
        self, jobs: Sequence[NewJob], conn: Any | None = None
    ) -> list[EnqueueResult]:
        if not jobs:
            return []
        payloads = [check_payload(job.payload) for job in jobs]
        with self._tx(conn) as c:
            inserted = self.rows(c, "job_insert_many", self._insert_params(jobs, payloads))
            self._notify(c, {row["key"] for row in inserted if row["state"] == "available"}, jobs)
        keys = {row["key"] for row in inserted}
        seen: set[str] = set()
        results = []
        for job in jobs:
            results.append(EnqueueResult(job.key, job.key in keys and job.key not in seen))
            seen.add(job.key)
        return results

    def _notify(self, conn: Any, due_keys: set[str], jobs: Sequence[NewJob]) -> None:  # noqa: B027
        """Hint listeners that due work arrived (PostgreSQL only; others poll)."""

    def job_claim(
        self,
        queues: Sequence[str],
        n: int,
        lease_seconds: float,
        owner: str,
        fair_share: bool = False,
    ) -> list[Job]:
        params = {
            "queues": self._list(queues),
            "n": n,
            "lease": lease_seconds,
            "owner": owner,
            "fair_share": fair_share,
        }
        jobs = [self._job(row) for row in self.run(None, "job_claim", params)]
        return sorted(jobs, key=lambda j: (j.priority, j.run_at, j.id))

    def job_heartbeat(self, job: Job, lease_seconds: float) -> bool:
        params = {"id": job.id, "token": job.lease_token, "lease": lease_seconds}
        return self.one(None, "job_heartbeat", params) is not None

    def job_complete(self, job: Job, conn: Any | None = None) -> None:
        """Complete a job; raises LeaseLost (so the caller's transaction rolls back)
        when the lease has moved on."""
        if self.one(conn, "job_complete", {"id": job.id, "token": job.lease_token}) is None:
            raise LeaseLost(f"job {job.key}: lease lost before completion")

    def job_complete_many(self, jobs: Sequence[Job], conn: Any) -> None:
        """Complete jobs run together in ``conn``'s transaction; raises LeaseLost
        (so that all of them roll back) when any lease has moved on."""
        params = {
            "ids": self._list([job.id for job in jobs]),
            "tokens": self._list([job.lease_token or "" for job in jobs]),
        }
        done = {row["id"] for row in self.rows(conn, "job_complete_many", params)}
        lost = [job.key for job in jobs if job.id not in done]
        if lost:
            raise LeaseLost(f"jobs {', '.join(lost)}: lease lost before completion")

    def job_fail(
        self, job: Job, error: str, kind: str, retry_delay: float | None
    ) -> JobState | None:
        """Record a failure. ``retry_delay`` None means permanent. Returns the new
        state, or None when the caller no longer held the lease."""
        params = {
            "id": job.id,
            "token": job.lease_token,
            "retry": retry_delay is not None,
            "delay": retry_delay or 0.0,
            "error": error[:4000],
            "kind": kind,
        }
        row = self.one(None, "job_fail", params)
        return JobState(row["state"]) if row else None

    def job_release(self, job: Job, delay: float = 0.0, conn: Any | None = None) -> bool:
        params = {"id": job.id, "token": job.lease_token, "delay": delay}
        return self.one(conn, "job_release", params) is not None

    def job_rescue(self) -> list[Row]:
        with self.maintenance_transaction() as conn:
            return self.rows(conn, "job_rescue")

    def job_redrive(
        self, keys: Sequence[str] = (), *, all: bool = False, policy: str | None = None
    ) -> list[Row]:
        params = {"keys": self._list(keys), "all": all, "policy": policy}
        with self.transaction() as conn:
            return self.rows(conn, "job_redrive", params)

    def job_discard(self, keys: Sequence[str]) -> list[Row]:
        with self.transaction() as conn:
            return self.rows(conn, "job_discard", {"keys": self._list(keys)})

    def job_get(self, key: str, conn: Any | None = None) -> Job | None:
        row = self.one(conn, "job_get", {"key": key})
        return self._job(row) if row else None

    def job_list(self, state: JobState, queue: str | None = None, limit: int = 100) -> list[Job]:
        with self.transaction() as conn:
            found = self.rows(
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

    def _bind(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    def job_pending_count(
        self, queue: str | None = None, *, due_only: bool = False, conn: Any | None = None
    ) -> int:
        """Jobs not yet final; with ``due_only``, those running or due now."""
        row = self.one(conn, "job_pending_count", {"queue": queue, "due_only": due_only})
        return int(row["n"]) if row else 0

    def job_stats(self) -> QueueStats:
        with self.transaction() as conn:
            counts = self.rows(conn, "job_counts")
            oldest = self.rows(conn, "job_oldest_due")
            running = self.rows(conn, "job_running")
            retries = self.rows(conn, "job_retries_by_kind")
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
        action: str | None = None,
        worker: str | None = None,
        rows: int = 0,
    ) -> bool:
        """True if this transaction now owns ``key``; False if it committed before.
        ``rows``: how many rows the operation affected, when that is known already.
        ``strict``: the caller has acted already and must own ``key``; should it
        not, AlreadyApplied is raised, so that its transaction rolls back."""
        params = ledger_params(
            key, policy=policy, run_id=run_id, lo=lo, hi=hi, action=action, worker=worker, rows=rows
        )
        booked = bool(self.rows(conn, "ledger_insert", params))
        if strict and not booked:
            raise AlreadyApplied(f"{key}: a concurrent delivery booked it first")
        return booked

    def ledger_get(self, key: str) -> Row | None:
        return self.one(None, "ledger_get", {"key": key})

    def audit_append(
        self,
        conn: Any | None,
        action: str,
        *,
        actor: str,
        policy: str | None = None,
        run_id: str | None = None,
        job_key: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        params = {
            "actor": actor,
            "action": action,
            "policy": policy,
            "run_id": run_id,
            "job_key": job_key,
            "detail": json.dumps(detail or {}, default=str),
        }
        with self._tx(conn) as c:
            self.rows(c, "audit_append", params)

    def audit_list(self, policy: str | None = None, limit: int = 100) -> list[Row]:
        with self.transaction() as conn:
            return self.rows(conn, "audit_list", {"policy": policy, "limit": limit})


def classify_exception(exc: BaseException) -> tuple[bool, str] | None:
    """Errors every engine classifies the same way: (transient, kind)."""
    from ..errors import PermanentError, TransientError

    if isinstance(exc, PermanentError):
        return False, type(exc).__name__
    if isinstance(exc, TransientError):
        return True, type(exc).__name__
    return None
