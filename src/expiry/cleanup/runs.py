"""Runs: finishing them, a run's summary, the newest runs, what is left of a
run, and waiting for a run to finish.

A run is ``policy:cutoff``: one planning job (PLAN), then the window jobs
(WINDOW) it emits. A run is opened by the planner's side, cleanup/service.py's
``Cleanup.open_run``, because opening checks the policy's table and queues the
first planning page in the same transaction; everything after is here. A
run's summary is what `expiry runs show`, `trigger --wait`, ``GET /v1/runs``
and the dashboard print, as a plain dict so every one of them shows the same
keys.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..engines.base import Engine
from ..errors import ConfigError
from ..times import format_time
from ..types import (
    UNFINISHED_STATES,
    AuditAction,
    JobState,
    LedgerEntry,
    Run,
    RunJobs,
    RunTotals,
    RunWait,
)
from . import approval

log = logging.getLogger("expiry.runs")

PLAN = "expiry.plan"
"""The handler of a run's planning jobs (cleanup/planner.py)."""

WINDOW = "expiry.window"
"""The handler of a run's window jobs."""

PARTITION = "expiry.partition"
"""The handler of a run's partition jobs: a whole expired partition detached
(and dropped), booked in the ledger like a window."""

VACUUM = "expiry.vacuum"
"""The handler of a finished run's VACUUM (ANALYZE) of its table (vacuum_after)."""


POLL_SECONDS = 0.2
"""How long a wait blocks between looks at the run when no hint arrives
(PostgreSQL hints as a run finishes; SQLite has no hints and polls at this pace)."""

Progress = Callable[[int, int], None]
"""Told (jobs done or dead, jobs in all) at every look of a wait."""


class Runs:
    """The runs of one database: read them, count what is left, wait for them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def summary(self, run_id: str) -> dict[str, Any] | None:
        """The run's counts and times, read in one transaction; None: no such run."""
        engine = self.engine
        with engine.transaction() as conn:
            run = engine.run_get(run_id, conn=conn)
            if run is None:
                return None
            jobs = engine.run_jobs(run_id, conn=conn)
            ledger = engine.run_ledger(run_id, conn=conn)
            duplicates = engine.run_duplicates(run_id, conn=conn)
            waits = [] if run.state == "finished" else self.waits(run_id, conn=conn)
            approved = approval.of_run(engine, run_id, conn=conn)
        summary = {**summarize(run, jobs, ledger, duplicates), "waiting": waits}
        summary["approval"] = None if approved is None else approved.as_dict()
        if approved is None or run.superseded_by is not None or run.cancelled_at is not None:
            if approved is not None and approved.state == approval.AWAITING:
                summary["approval"]["state"] = approval.CLOSED  # never approved, and never will
        elif approved.state == approval.AWAITING and run.state != "finished":
            summary["outcome"] = "awaiting approval"
        elif approved.state == approval.EXPIRED:
            summary["outcome"] = "approval expired" if run.state == "finished" else "expiring"
        return summary

    def waits(self, run_id: str, *, conn: Any | None = None) -> list[dict[str, Any]]:
        """What the run's pending jobs wait for, one entry a state and reason,
        each with a line that says it (``why``), longest wait first."""
        found = self.engine.run_waits(run_id, conn=conn)
        return [
            {
                "state": w.state,
                "jobs": w.n,
                "reason": w.reason,
                "why": _why(w),
                "since": format_time(w.since),
                "next_at": format_time(w.next_at),
            }
            for w in sorted(found, key=lambda w: w.since)
        ]

    def recent(self, policy: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """The summaries of the newest ``limit`` runs (of one policy when given)."""
        found = self.engine.run_list(policy, limit)
        return [s for r in found if (s := self.summary(r.id)) is not None]

    def evidence(
        self, policy: str, since: datetime | None = None, limit: int = 100_000
    ) -> list[dict[str, Any]]:
        """What ``policy``'s runs deleted or archived, per run, oldest first,
        from the ledger rows booked at or after ``since`` (at most ``limit`` of
        them: a caller pages on with the last one's time): each run's cutoff,
        times, outcome and totals, and every operation with its range, rows,
        time and worker (``expiry evidence``, ``GET /v1/evidence/{policy}``).
        Read in one transaction."""
        engine = self.engine
        with engine.read_transaction() as conn:
            entries = engine.ledger_list(policy, since, limit=limit, conn=conn)
            ids = {e.run_id for e in entries if e.run_id is not None}
            runs = {rid: engine.run_get(rid, conn=conn) for rid in ids}
        found: dict[str, dict[str, Any]] = {}
        for entry in entries:
            run = runs.get(entry.run_id or "")
            if run is None or entry.run_id is None:
                continue  # its run pruned meanwhile
            item = found.get(run.id)
            if item is None:
                item = found[run.id] = _evidence_of(run)
            action = entry.action or "delete"
            item["rows_affected"] += entry.rows_affected
            by_action = item["rows_by_action"]
            by_action[action] = by_action.get(action, 0) + entry.rows_affected
            item["operations"].append(_operation(entry, action))
        return list(found.values())

    def prune(self, older_than: float, batch: int = 10_000) -> tuple[int, int]:
        """Delete the ledger rows of runs finished more than ``older_than``
        seconds ago, then those runs ([retention] ledger): (ledger rows, runs)."""
        ledger = runs = 0
        while True:
            rows, gone = self.engine.ledger_prune(older_than, batch)
            ledger, runs = ledger + rows, runs + gone
            if rows < batch and gone < batch:
                break
        if ledger or runs:
            log.info(
                "pruned %d ledger rows and %d runs finished over %.0fs ago",
                ledger,
                runs,
                older_than,
            )
        return ledger, runs

    def pending(self, run_id: str) -> int:
        """The run's jobs (planning and windows) not yet completed, dead or cancelled."""
        return sum(j.n for j in self.engine.run_jobs(run_id) if j.state in UNFINISHED_STATES)

    def finish(self, run_id: str) -> bool:
        """Finish the run if it is planned and nothing of it is pending; True if it
        finished now (a worker's batch, a wait that finds nothing left). A write that
        conflicted with another's (a deadlock error: on a Galera cluster, another
        node finishing the same run, or completing its last job, certified first)
        finishes nothing here: the caller reads the run again, and the rescuer's
        sweep finishes what is left."""
        try:
            finished = self.engine.run_finish(run_id)
        except Exception as exc:
            if self.engine.classify(exc)[1] != "deadlock":
                raise
            log.info("run finish conflicted with another write: %s", exc, extra={"run": run_id})
            return False
        if finished:
            log.info("run finished", extra={"run": run_id})
        return finished

    def cancel(self, run_id: str, *, actor: str) -> dict[str, Any]:
        """Cancel a run: its planning stops and its waiting jobs are cancelled, in
        one transaction; jobs running now finish (their rows are expired rows:
        deleting them is safe), and the run finishes after them, its outcome
        "cancelled". Audited. Returns the run's summary with ``jobs_cancelled``.
        Raises ConfigError when there is no such run or it finished already."""
        engine = self.engine
        with engine.transaction() as conn:
            run = engine.run_get(run_id, conn=conn)
            if run is None:
                raise ConfigError(f"no run {run_id!r}")
            cancelled = engine.run_cancel(run_id, actor, conn=conn)
            if cancelled is None:
                raise ConfigError(
                    f"run {run_id!r} is {'cancelled' if run.cancelled_at else run.state}: "
                    "nothing to cancel"
                )
            engine.audit_append(
                conn,
                AuditAction.RUN_CANCELLED,
                actor=actor,
                run_id=run_id,
                policy=run.policy,
                detail={"jobs_cancelled": len(cancelled)},
            )
        log.info("run cancelled", extra={"run": run_id, "jobs": len(cancelled), "actor": actor})
        self.finish(run_id)  # nothing running: finished now; else after the last one
        summary = self.summary(run_id)
        assert summary is not None
        return {**summary, "jobs_cancelled": len(cancelled)}

    def finish_idle(self) -> list[str]:
        """Finish every run with nothing pending (the rescuer's sweep): a worker
        that died after its run's last commit, or a last job that ended dead,
        leaves the run open otherwise. The ids it finished."""
        finished = self.engine.run_finish_idle()
        for run_id in finished:
            log.info("run finished", extra={"run": run_id})
        return finished

    def wait(
        self,
        run_id: str,
        *,
        progress: Progress | None = None,
        poll: float = POLL_SECONDS,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Block until the run is finished, or nothing of it is left to do, or
        ``timeout`` seconds passed (None: no bound); its summary then, with
        ``timed_out`` true in the last case (the run goes on without the
        waiter). Raises LookupError for an unknown run."""
        deadline = None if timeout is None else time.monotonic() + timeout
        followed: list[str] = []
        while True:
            summary = self._summary_of(run_id)
            if later := summary["superseded_by"]:
                # A later run of the policy took this one's place: its rows are
                # that run's to delete, so the wait goes on with it.
                log.info("run superseded: waiting for %s", later, extra={"run": run_id})
                followed.append(run_id)
                run_id = later
                continue
            summary = {**summary, **_supersedes(followed)}
            if progress is not None:
                progress(summary["jobs_done"] + summary["jobs_dead"], summary["jobs_total"])
            if summary["state"] == "finished":
                return summary
            if deadline is not None and time.monotonic() >= deadline:
                return {**summary, "timed_out": True}
            if not self.pending(run_id):
                # Nothing of the run is left to do, yet it is not finished: its last
                # job died (workers finish a run only after a success), or its
                # planning job did. Finish it if it was planned; either way, stop.
                self.finish(run_id)
                return {**(self.summary(run_id) or summary), **_supersedes(followed)}
            self.engine.wait_for_runs(poll)

    def _summary_of(self, run_id: str) -> dict[str, Any]:
        summary = self.summary(run_id)
        if summary is None:
            raise LookupError(f"no run {run_id!r}")
        return summary


def _retries(windows: list[RunJobs]) -> int:
    """Failures followed by another attempt (a dead job's last failure ended
    it); a lost lease is counted as a redelivery, not here."""
    return max(
        0,
        sum(j.failures - j.redelivered for j in windows)
        - sum(j.n for j in windows if j.state == JobState.DEAD),
    )


def summarize(run: Run, jobs: list[RunJobs], ledger: RunTotals, duplicates: int) -> dict[str, Any]:
    """A run's summary from its row, its jobs by state, its ledger totals and the
    duplicates its windows absorbed. Counts are of window (and partition) jobs only."""
    windows = [j for j in jobs if j.handler in (WINDOW, PARTITION)]
    by_state = {j.state: j.n for j in windows}
    return {
        "id": run.id,
        "policy": run.policy,
        "cutoff": format_time(run.cutoff),
        "opened_by": run.opened_by,
        "state": run.state,
        "windows_planned": run.windows_planned,
        "jobs_total": sum(by_state.values()),
        "jobs_done": by_state.get(JobState.COMPLETED, 0),
        "jobs_dead": by_state.get(JobState.DEAD, 0),
        "jobs_by_state": by_state,
        "windows_applied": ledger.windows,
        "rows_affected": ledger.rows,
        "rows_blocked": ledger.blocked,
        "duplicates_skipped": duplicates,
        "retries": _retries(windows),
        "outcome": _outcome(run, by_state.get(JobState.DEAD, 0)),
        "cancelled_at": _time(run.cancelled_at),
        "cancelled_by": run.cancelled_by,
        "superseded_by": run.superseded_by,
        "stalled": run.stalled_at is not None and run.state != "finished",
        "stalled_at": _time(run.stalled_at),
        # Windows delivered again after their lease was lost (a worker killed or
        # cut off): the rescuer's lease_expired records, counted (attempts spent
        # minus failures went negative once a redrive or a refund reset them).
        "redelivered": sum(j.redelivered for j in windows),
        "opened_at": _time(run.opened_at),
        "planned_at": _time(run.planned_at),
        "finished_at": _time(run.finished_at),
    }


def _outcome(run: Run, dead: int) -> str:
    """The run's state as on-call reads it: a finished run with dead windows is
    not a clean one ("finished with 29 dead"); a cancelled one says so
    ("cancelling" while its running jobs end)."""
    if run.superseded_by is not None:
        return f"superseded by {run.superseded_by}"
    if run.cancelled_at is not None:
        return "cancelled" if run.state == "finished" else "cancelling"
    if run.state == "finished" and dead:
        return f"finished with {dead} dead"
    return run.state


def _why(wait: RunWait) -> str:
    """A run's waiting jobs in words: "2 retrying after lock_timeout (...)"."""
    jobs = f"{wait.n} job{'s' if wait.n != 1 else ''}"
    if wait.state == JobState.SCHEDULED:
        return f"{jobs} waiting: {wait.reason or 'snoozed'}"
    if wait.state == JobState.RETRYABLE:
        error = (wait.error or "").strip().splitlines()[0][:200] if wait.error else ""
        return f"{jobs} retrying after {wait.reason or 'an error'}" + (
            f": {error}" if error else ""
        )
    if wait.state == JobState.RUNNING:
        return f"{jobs} running"
    return f"{jobs} due, waiting for a worker"


def _supersedes(followed: list[str]) -> dict[str, Any]:
    """The runs a wait followed to their successor, as the summary shows them."""
    return {"supersedes": followed} if followed else {}


def _time(value: datetime | None) -> str | None:
    return None if value is None else format_time(value)


def _evidence_of(run: Run) -> dict[str, Any]:
    """A run's evidence before its operations are added."""
    return {
        "run_id": run.id,
        "policy": run.policy,
        "cutoff": format_time(run.cutoff),
        "opened_by": run.opened_by,
        "opened_at": _time(run.opened_at),
        "finished_at": _time(run.finished_at),
        "outcome": _outcome(run, 0),
        "rows_affected": 0,
        "rows_by_action": {},
        "operations": [],
    }


def _operation(entry: LedgerEntry, action: str) -> dict[str, Any]:
    """One ledger row as evidence: the window's range, its rows, when and by whom."""
    return {
        "key": entry.key,
        "action": action,
        "range": (
            f"keys ({entry.lo}, {entry.hi}]"
            if entry.lo is not None and entry.hi is not None
            else entry.bounds or ""
        ),
        "rows": entry.rows_affected,
        "applied_at": format_time(entry.applied_at),
        "worker": entry.worker,
        "kept": entry.kept,
        "blocked": entry.blocked,
    }
