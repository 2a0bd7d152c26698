"""The seam's part for the queue: jobs inserted, claimed, leased, completed,
retried, dead-lettered and pruned, and what the queue reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import (
    LeaseLost,
)
from ...types import (
    EnqueueResult,
    Job,
    JobState,
    LockHolder,
    NewJob,
    QueueStats,
)
from ..common import Row, check_payload, enqueue_results, in_turns
from .primitives import Primitives


class JobsSeam(Primitives):
    """The durable delayed queue's operations."""

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
        """Jobs not yet final; with ``due_only``, those running or due now. Read
        without writing (an ``until_idle`` loop asks every poll: on SQLite a
        write transaction would take the lock a working thread needs)."""
        params = {"queue": queue, "due_only": due_only}
        if conn is None:
            with self.read_transaction() as own:
                rows = self._rows(own, "job_pending_count", params)
        else:
            rows = self._rows(conn, "job_pending_count", params)
        return int(rows[0]["n"]) if rows else 0

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
