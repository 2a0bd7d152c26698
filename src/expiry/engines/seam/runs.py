"""The seam's part for runs: a policy's runs, opened, planned, turned,
finished and read back, with their totals and waits."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ...types import (
    PolicyTotals,
    Run,
    RunJobs,
    RunTotals,
    RunTurn,
    RunWait,
)
from ..common import Row
from .primitives import Primitives


class RunsSeam(Primitives):
    """A policy's runs."""

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
