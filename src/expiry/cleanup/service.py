"""The cleanup service: a policy's runs, from the cutoff to the last window.

    open_run  ── run row (id = policy:cutoff) + planning job ──► queue
    plan page ── windows (lo, lo+window] as jobs + the next page ──► queue
    window    ── delete/archive, booked in the ledger with the job's completion: one transaction
    batch     ── after a worker's claimed batch: finish the runs with nothing pending

A window job may apply only part of its range when the previous transactions
of its policy ran long, or when its own last attempts timed out (half of its
candidates after one timeout, a quarter after two, down to one row): it then
enqueues the rest as a continuation job keyed by its new lower bound, in the
same transaction. Every ledger row therefore covers a disjoint key range of
its run, and a redelivered job finds its ledger row and does nothing. A row
that still times out alone, or a window at its last attempt, is never left to
die: the row is kept and booked as blocked, the window split (_blocked).

The parts, each a floor of the Cleanup class: policies.py (the policies and
their checked tables), planner.py (the planning job), pacing.py (how fast
windows go), window.py (the window job), partitions.py (the partition job),
preview.py (``expiry plan`` and the watermark); jobs.py builds the jobs they
queue. This module opens and finishes runs and wires the handlers.

Overlap: a run whose policy still has pending jobs from an earlier run waits
(its planning job snoozes) until they finish; the later cutoff then covers
whatever the earlier run would have deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..config import Policy
from ..errors import ConfigError, CutoffRefused, KeyConflict
from ..queue.handlers import Handler
from ..queue.jobs import new_job, policy_queue
from ..times import format_duration, format_time
from ..types import AuditAction, Job
from . import approval
from .jobs import first_plan_job
from .partitions import Partitions
from .preview import Previews
from .runs import PARTITION, PLAN, VACUUM, WINDOW
from .window import Windows

log = logging.getLogger("expiry.cleanup")


def run_id(policy: str, cutoff: datetime) -> str:
    return f"{policy}:{format_time(cutoff)}"


@dataclass(frozen=True)
class RunOpened:
    run_id: str
    policy: str
    cutoff: datetime
    created: bool
    """False when this cutoff's run existed already: nothing new was enqueued."""


class Cleanup(Windows, Partitions, Previews):
    """The cleanup service: opens and finishes runs; its parts handle the
    planning, window and partition jobs (planner.py, window.py, partitions.py),
    pace them (pacing.py) and preview a run (preview.py)."""

    def open_run(
        self,
        name: str,
        cutoff: datetime | None = None,
        *,
        opened_by: str = "trigger",
        actor: str = "operator",
        conn: Any | None = None,
        force: bool = False,
    ) -> RunOpened:
        """Open the run for ``cutoff`` (default: the database's now() - retain),
        inside ``conn``'s transaction when given. A cutoff later than now - retain
        would delete rows still within retention: it is refused (CutoffRefused)
        unless ``force``."""
        policy = self.policy(name)
        engine = self.engine
        with engine.transaction_or(conn) as tx:
            self.target(name, tx)
            cutoff = self._cutoff(policy, engine.now(tx), cutoff, force)
            rid = run_id(name, cutoff)
            created = engine.run_insert(rid, name, cutoff, opened_by, conn=tx)
            if created:
                [planned] = engine.job_insert_many([first_plan_job(policy, rid, cutoff)], tx)
                if not planned.enqueued:  # the key is taken by a job outside the run
                    raise KeyConflict(
                        f"run {rid}: its planning job's key {planned.key!r} is held by "
                        "another job (not one of expiry's own); discard that job and trigger again"
                    )
                engine.audit_append(
                    tx,
                    AuditAction.RUN_OPENED,
                    actor=actor,
                    policy=name,
                    run_id=rid,
                    detail={"cutoff": format_time(cutoff), "opened_by": opened_by},
                )
        log.info(
            "run opened" if created else "run already open", extra={"policy": name, "run": rid}
        )
        return RunOpened(rid, name, cutoff, created)

    def approve(self, run_id: str, *, actor: str) -> dict[str, Any]:
        """Approve a run awaiting approval (cleanup/approval.py): its preview
        under the policy as configured now. ConfigError says why not."""
        run = self.engine.run_get(run_id)
        if run is None:
            raise ConfigError(f"no run {run_id!r}")
        return approval.approve(self.engine, self.policy(run.policy), run_id, actor)

    @staticmethod
    def _cutoff(policy: Policy, now: datetime, cutoff: datetime | None, force: bool) -> datetime:
        """The run's cutoff: the one given, or the database's now - retain. A given
        cutoff later than now - retain is refused unless ``force``."""
        latest = now - timedelta(seconds=policy.retain)
        if cutoff is None:
            cutoff = latest.replace(microsecond=0)
        elif cutoff > latest and not force:
            raise CutoffRefused(
                f"policy {policy.name!r}: cutoff {format_time(cutoff)} is later than now - "
                f"retain ({format_time(now)} - {format_duration(policy.retain)} = "
                f"{format_time(latest)}): rows still within retention would be deleted. "
                "Fix: give an earlier cutoff, or none for now - retain; if this is "
                'intended, pass --force (CLI) or "force": true (HTTP)'
            )
        return cutoff

    def finish_runs(self, run_ids: set[str]) -> None:
        """Finish each run that is planned and has nothing pending (cleanup/runs.py's rule)."""
        self._after_finish([rid for rid in run_ids if self.runs.finish(rid)])

    def finish_idle_runs(self) -> int:
        """The rescuer's sweep (Runs.finish_idle): how many runs it finished."""
        finished = self.runs.finish_idle()
        self._after_finish(finished)
        return len(finished)

    def open_run_ages(self) -> dict[str, float]:
        """Per policy with a run not yet finished: the age in seconds of its
        oldest, by the database's clock."""
        with self.engine.transaction() as conn:
            now = self.engine.now(conn)
            oldest = self.engine.run_open_oldest(conn=conn)
        return {name: (now - opened).total_seconds() for name, opened in oldest.items()}

    def awaiting_approval(self) -> dict[str, str]:
        """The policies with ``approve = true`` whose newest open run awaits its
        approval now, with that run's id (cleanup/approval.py)."""
        found: dict[str, str] = {}
        for policy in self.policies:
            if not policy.approve:
                continue
            for run in self.engine.run_list(policy.name, 5):
                if run.state == "finished" or policy.name in found:
                    continue
                state = approval.of_run(self.engine, run.id)
                if state is not None and state.state == approval.AWAITING:
                    found[policy.name] = run.id
        return found

    def stalled(self) -> dict[str, float]:
        """The policies whose oldest open run is older than its stall_after,
        with that age in seconds (a policy no longer in the config is left out)."""
        bounds = {p.name: p.stall_seconds for p in self.policies}
        return {
            name: age
            for name, age in self.open_run_ages().items()
            if name in bounds and age > bounds[name]
        }

    def mark_stalled(self) -> list[str]:
        """Mark each policy's runs open past its stall_after as stalled, once
        each, with an audit event and an error line naming what they wait for;
        the ids marked now (the rescuer's and the scheduler's sweep)."""
        marked: list[str] = []
        for policy in self.policies:
            with self.engine.transaction() as tx:
                for rid, opened in self.engine.run_mark_stalled(
                    policy.name, policy.stall_seconds, conn=tx
                ):
                    waits = self.runs.waits(rid, conn=tx)
                    self.engine.audit_append(
                        tx,
                        AuditAction.RUN_STALLED,
                        actor="expiry",
                        policy=policy.name,
                        run_id=rid,
                        detail={
                            "opened_at": format_time(opened),
                            "stall_after": format_duration(policy.stall_seconds),
                            "waiting": waits,
                        },
                    )
                    marked.append(rid)
                    log.error(
                        "run stalled: open for more than %s; %s",
                        format_duration(policy.stall_seconds),
                        "; ".join(w["why"] for w in waits) or "nothing of it is pending",
                        extra={"policy": policy.name, "run": rid},
                    )
        return marked

    def sweep(self) -> None:
        """The rescuer's sweep: finish runs left open, mark stalled ones."""
        self.finish_idle_runs()
        self.mark_stalled()

    def _after_finish(self, run_ids: list[str]) -> None:
        """A run just finished: the newest run of its policy waiting for its turn
        plans now, not at its next look; the table's VACUUM (ANALYZE) is queued
        when the policy asks (vacuum_after), in the policy's queue, under its
        throttle."""
        for rid in run_ids:
            name = rid.split(":", 1)[0]
            waiting = [t for t in self.engine.run_turns(name) if not t.started]
            if waiting:
                self.engine.job_wake(f"{waiting[-1].id}:plan")
            try:
                policy = self.policy(name)
            except Exception:  # a policy removed from the config since
                continue
            if policy.vacuum_after:
                job = new_job(
                    VACUUM,
                    {"policy": name, "run_id": rid},
                    key=f"{rid}:vacuum",
                    max_attempts=policy.max_attempts,
                    priority=policy.priority,
                    queue=policy_queue(name),
                )
                self.engine.job_insert_many([job])

    def vacuum(self, job: Job) -> None:
        """VACUUM (ANALYZE) the policy's table, outside any transaction."""
        policy = self.policy(job.payload["policy"])
        began = time.monotonic()
        with self.engine.transaction(statement=True) as conn:
            self.engine.table_vacuum(conn, policy.table)
        log.info(
            "table vacuumed in %.1fs",
            time.monotonic() - began,
            extra={"policy": policy.name, "run": job.payload.get("run_id"), "job": job.key},
        )

    def finish_batch(self, jobs: list[Job]) -> None:
        """After a worker ran a claimed batch: finish the runs of its jobs that
        have nothing left pending. One check per run and batch, not per window;
        a run whose last job's worker died before this is left to the rescuer's
        sweep (finish_idle_runs)."""
        self.finish_runs({j.payload["run_id"] for j in jobs if j.payload.get("run_id")})


def handlers(cleanup: Callable[[], Cleanup]) -> list[Handler]:
    """The built-in planning and window jobs, over the Cleanup that ``cleanup``
    returns (the App builds it on first use). The window job completes its own
    job in its one statement (queue/handlers.py's private modes)."""
    return [
        Handler(
            PLAN,
            lambda job, tx: cleanup().plan_page(job, tx),
            after=lambda job, windows, seconds: cleanup().after_plan(job, windows, seconds),
            failed=lambda job, kind: cleanup().plan_failed(job, kind),
            after_batch=lambda jobs: cleanup().finish_batch(jobs),
        ),
        Handler(
            PARTITION,
            lambda job, tx: cleanup().apply_partition(job, tx),
            after=lambda job, result, seconds: cleanup().after_window(job, result, seconds),
            after_batch=lambda jobs: cleanup().finish_batch(jobs),
        ),
        Handler(VACUUM, lambda job: cleanup().vacuum(job), transactional=False),
        Handler(
            WINDOW,
            lambda job, tx: cleanup().apply_window(job, tx),
            before=lambda job: cleanup().before_window(job),
            after=lambda job, result, seconds: cleanup().after_window(job, result, seconds),
            failed=lambda job, kind: cleanup().window_failed(job, kind),
            after_batch=lambda jobs: cleanup().finish_batch(jobs),
            completes_job=True,
            statement=True,
        ),
    ]
