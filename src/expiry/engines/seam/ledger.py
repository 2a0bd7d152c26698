"""The seam's part for evidence: the ledger (one row per applied window), the
audit log, and a window applied and booked in one transaction."""

from __future__ import annotations

import abc
import json
from datetime import datetime
from typing import Any

from ...errors import (
    AlreadyApplied,
)
from ...types import (
    AuditAction,
    AuditCount,
    AuditEvent,
    LedgerEntry,
    LedgerMinute,
    WindowApply,
)
from ..common import Row, ledger_params
from .jobs import JobsSeam


class LedgerSeam(JobsSeam):
    """The ledger, the audit log, and a window's booking."""

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

    def ledger_minutes(self, since: datetime, *, conn: Any | None = None) -> list[LedgerMinute]:
        """Windows and rows applied per policy and minute since ``since``,
        oldest first (a minute with none is absent): the history the
        dashboard draws, from the ledger rather than any process's memory."""
        return [
            LedgerMinute(
                policy=row["policy"],
                minute=self._time(row["minute"]),
                windows=int(row["windows"]),
                rows=int(row["rows"]),
            )
            for row in self._tx_rows(conn, "ledger_minutes", {"since": self.time_param(since)})
        ]

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

    def audit_holds_lock(self, conn: Any) -> None:
        """Hold, until ``conn``'s transaction ends, the lock that serializes the
        auditing of the config's holds (cleanup/holds.py): another process
        doing the same waits, then reads what this one appended."""
        self._rows(conn, "audit_holds_lock")

    def audit_hold_events(self, *, conn: Any | None = None) -> list[AuditEvent]:
        """Every hold.placed and hold.lifted event, oldest first."""
        return [self._as_audit_event(row) for row in self._tx_rows(conn, "audit_holds")]

    def audit_approvals(self, run_id: str, *, conn: Any | None = None) -> list[AuditEvent]:
        """The run's run.awaiting_approval, run.approved and
        run.approval_expired events, oldest first."""
        found = self._tx_rows(conn, "audit_approvals", {"run_id": run_id})
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
