"""The cleanup core: runs, the planner's pages and the window job.

    open_run  ── run row (id = policy:cutoff) + planning job ──► queue
    plan page ── windows (lo, lo+window] as jobs + the next page ──► queue
    window    ── delete/archive, booked in the ledger with the job's completion: one transaction
    batch     ── after a worker's claimed batch: finish the runs with nothing pending

A window job may apply only part of its range when the previous transactions
of its policy ran long: it then enqueues the rest as a continuation job keyed
by its new lower bound, in the same transaction. Every ledger row therefore
covers a disjoint key range of its run, and a redelivered job finds its ledger
row and does nothing.

Overlap: a run whose policy still has pending jobs from an earlier run waits
(its planning job snoozes) until they finish; the later cutoff then covers
whatever the earlier run would have deleted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from . import defaults
from .config import Config, Policy
from .durations import format_duration
from .engines import Engine
from .errors import CutoffRefused, PermanentError, SchemaError, Snooze
from .handlers import Handler
from .metrics import WINDOW_ROWS
from .queue import new_job
from .runs import PLAN, WINDOW, Runs
from .target import Target
from .times import format_time, parse_time
from .timestamps import Storage
from .types import AuditAction, Job, NewJob

log = logging.getLogger("expiry.cleanup")

MIN_CHUNK = 100
MAX_REST_SECONDS = 2.0  # a nice_ratio rest never outlasts this (a stop waits for it)
OVERLAP_WAIT_SECONDS = 5.0


def run_id(policy: str, cutoff: datetime) -> str:
    return f"{policy}:{format_time(cutoff)}"


@dataclass(frozen=True)
class RunOpened:
    run_id: str
    policy: str
    cutoff: datetime
    created: bool
    """False when this cutoff's run existed already: nothing new was enqueued."""


@dataclass(frozen=True)
class WindowResult:
    """A window job's result: the rows it took, or None when its key was booked
    before and this delivery changed nothing."""

    policy: str
    taken: int | None

    @property
    def rows(self) -> int:
        return self.taken or 0

    @property
    def duplicate(self) -> bool:
        """Booked before: this delivery changed nothing."""
        return self.taken is None


@dataclass(frozen=True)
class PlanPreview:
    policy: str
    cutoff: datetime
    candidates: int
    windows: int
    first_windows: list[tuple[int, int]]
    storage: str = ""
    """How the timestamp column stores time, as this preview read it."""


@dataclass
class _Pace:
    """Per policy, per process: keys per transaction and the rate limit's clock."""

    chunk: int
    not_before: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Cleanup:
    def __init__(self, engine: Engine, config: Config, runs: Runs | None = None) -> None:
        self.engine = engine
        self.config = config
        self.runs = runs or Runs(engine)
        self._targets: dict[str, Target] = {}
        self._paces: dict[str, _Pace] = {}
        self._lock = threading.Lock()

    @property
    def policies(self) -> list[Policy]:
        return list(self.config.policy)

    def policy(self, name: str) -> Policy:
        policy: Policy = self.config.get_policy(name)
        return policy

    def reload(self, config: Config) -> None:
        """After a config reload: the new policies, each checked again on next use."""
        self.config = config
        self.forget_targets()

    # -- the schema check ---------------------------------------------------------

    def target(self, name: str, conn: Any | None = None) -> Target:
        """The policy's table, checked against the live schema once per process."""
        with self._lock:
            target = self._targets.get(name)
        if target is None:
            target = Target(self.engine, self.policy(name))
            with self.engine.transaction_or(conn) as tx:
                for warning in target.check(tx):
                    log.warning(warning)
            with self._lock:
                self._targets[name] = target
        return target

    def forget_targets(self) -> None:
        """After a config reload: check each policy's table again on next use."""
        with self._lock:
            self._targets.clear()
            self._paces.clear()

    def check(self) -> list[str]:
        """Check every policy now; raises SchemaError on the first that does not fit."""
        warnings: list[str] = []
        for policy in self.policies:
            target = Target(self.engine, policy)
            with self.engine.transaction() as conn:
                warnings += target.check(conn)
            with self._lock:
                self._targets[policy.name] = target
        return warnings

    # -- runs ---------------------------------------------------------------------

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
                engine.job_insert_many([_plan_job(policy, rid, cutoff)], tx)
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
        """Finish each run that is planned and has nothing pending (runs.py's rule)."""
        for rid in run_ids:
            self.runs.finish(rid)

    def finish_idle_runs(self) -> int:
        """The rescuer's sweep (Runs.finish_idle): how many runs it finished."""
        return len(self.runs.finish_idle())

    # -- the planning job -------------------------------------------------------

    def plan_page(self, job: Job, tx: Any) -> int:
        """Emit one page of windows and, unless it was the last, the next page."""
        p = job.payload
        policy, target = self.policy(p["policy"]), self.target(p["policy"], tx)
        cutoff = parse_time(p["cutoff"])
        after: int | None = p.get("after")
        max_key: int = p.get("max") or 0
        page = defaults.PLAN_PAGE
        first_page = after is None
        if after is None:
            page = min(defaults.FIRST_PLAN_PAGE, page)
            start = self._start_run(policy, target, p, cutoff, tx)
            if start is None:
                return 0
            p, (after, max_key) = start
        storage = _storage(p, target)
        los = target.plan_page(tx, cutoff, after, max_key, page, storage)
        jobs = [_window_job(policy, p, lo, storage) for lo in los]
        last_page = len(los) < page
        if not last_page:
            cursor = los[-1] + policy.window
            # Planning keeps ahead of the deletes: the next page's job is queued
            # (claimed) before this page's second half, or before all of a run's
            # short first page, so one worker plans it while the others delete
            # instead of every worker waiting for it after the last window.
            jobs.insert(
                0 if first_page else len(jobs) // 2,
                new_job(
                    PLAN,
                    {**p, "after": cursor, "max": max_key},
                    key=f"{p['run_id']}:plan:{cursor}",
                    max_attempts=policy.max_attempts,
                    priority=policy.priority,
                ),
            )
        self.engine.job_insert_many(jobs, tx)
        self.engine.run_add_windows(p["run_id"], len(los), done=last_page, conn=tx)
        return len(los)

    def _start_run(
        self, policy: Policy, target: Target, p: dict[str, Any], cutoff: datetime, tx: Any
    ) -> tuple[dict[str, Any], tuple[int, int]] | None:
        """A run's first page: wait for an earlier run of the policy, read the
        column's storage and the candidates' key range, and check a sample before
        any window exists. Returns the payload (with the storage) and the planner's
        start, or None when nothing is expired (the run is then done)."""
        pending = self.engine.run_pending_elsewhere(policy.name, p["run_id"], conn=tx)
        if pending:
            raise Snooze(OVERLAP_WAIT_SECONDS, f"{pending} jobs of an earlier run are pending")
        try:
            # The run reads the column's storage once, from the data as it is
            # now, and every window of the run compares in that domain.
            storage = target.detect(tx)
            bounds = target.bounds(tx, cutoff, storage)
            if bounds is not None:
                target.sample_check(tx, cutoff, storage)
        except SchemaError as exc:
            raise PermanentError(str(exc)) from exc
        if bounds is None:
            self.engine.run_add_windows(p["run_id"], 0, done=True, conn=tx)
            return None
        return {**p, "storage": storage.token}, (bounds[0] - 1, bounds[1])

    def after_plan(self, job: Job, windows: int, seconds: float) -> None:
        log.info(
            "planned %d windows",
            windows,
            extra={
                "policy": job.payload["policy"],
                "run": job.payload["run_id"],
                "job": job.key,
                "attempt": job.attempt,
            },
        )

    # -- the window job -----------------------------------------------------------

    def apply_window(self, job: Job, tx: Any) -> WindowResult:
        """Delete or archive, booked in the ledger with its rows, and complete the
        job: on PostgreSQL one statement, its own transaction (the worker's
        statement mode). A window cut short by pacing enqueues its rest in the
        same transaction, opened for the two. The ledger row is the window's
        record (range, rows, worker, time); only a duplicate delivery is audited."""
        p = job.payload
        policy, target = self.policy(p["policy"]), self.target(p["policy"], tx)
        lo, hi = int(p["lo"]), int(p["hi"])
        upto = min(hi, lo + self._pace(policy).chunk)
        try:
            with self.engine.atomic(tx) if upto < hi else nullcontext():
                taken = target.apply(
                    tx,
                    parse_time(p["cutoff"]),
                    lo,
                    upto,
                    key=job.key,
                    run_id=p["run_id"],
                    worker=job.lease_owner,
                    job=job,  # completed in the same statement (PostgreSQL) or transaction
                    storage=_storage(p, target),
                )
                # The delivery that booked the window's first part enqueues the rest.
                if upto < hi and taken is not None:
                    rest = new_job(
                        WINDOW,
                        {**p, "lo": upto, "hi": hi},
                        key=f"{p['run_id']}:{upto}",
                        max_attempts=policy.max_attempts,
                        priority=policy.priority,
                    )
                    self.engine.job_insert_many([rest], tx)
        except SchemaError as exc:
            raise PermanentError(str(exc)) from exc
        return WindowResult(policy.name, taken)

    def _pace(self, policy: Policy) -> _Pace:
        with self._lock:
            return self._paces.setdefault(policy.name, _Pace(chunk=policy.window))

    def before_window(self, job: Job) -> None:
        """Check the policy's table (once per process, in a transaction of its own:
        the window's is one statement); honour
        max_rows_per_second: wait out the previous transaction's rows."""
        try:
            self.target(job.payload["policy"])
        except SchemaError as exc:
            raise PermanentError(str(exc)) from exc
        pace = self._pace(self.policy(job.payload["policy"]))
        delay = pace.not_before - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def after_window(self, job: Job, result: WindowResult, seconds: float) -> None:
        """Adapt keys per transaction toward target_transaction; book the rate limit;
        rest nice_ratio times the transaction's duration."""
        policy = self.policy(job.payload["policy"])
        WINDOW_ROWS.labels(policy.name).observe(result.rows)
        pace = self._pace(policy)
        with pace.lock:
            if result.rows and seconds > policy.target_transaction * 1.5:
                pace.chunk = max(MIN_CHUNK, pace.chunk // 2)
            elif seconds < policy.target_transaction / 2:
                pace.chunk = min(policy.window, pace.chunk * 2)
            if policy.max_rows_per_second:
                pace.not_before = max(pace.not_before, time.monotonic()) + (
                    result.rows / policy.max_rows_per_second
                )
        log.info(
            "window applied"
            if not result.duplicate
            else "window already applied: duplicate skipped",
            extra={
                "policy": policy.name,
                "run": job.payload["run_id"],
                "job": job.key,
                "attempt": job.attempt,
                "rows": result.rows,
            },
        )
        if policy.nice_ratio and result.rows:
            # Rest on this thread as the transaction took, times nice_ratio: the
            # database's CPU, I/O and locks go back to live traffic in between.
            time.sleep(min(policy.nice_ratio * seconds, MAX_REST_SECONDS))

    def finish_batch(self, jobs: list[Job]) -> None:
        """After a worker ran a claimed batch: finish the runs of its jobs that
        have nothing left pending. One check per run and batch, not per window;
        a run whose last job's worker died before this is left to the rescuer's
        sweep (finish_idle_runs)."""
        self.finish_runs({j.payload["run_id"] for j in jobs if j.payload.get("run_id")})

    # -- reading ------------------------------------------------------------------

    def watermark(self, name: str) -> float:
        """Seconds since the oldest expired row still present became expired (0: none)."""
        policy, target = self.policy(name), self.target(name)
        with self.engine.transaction() as conn:
            cutoff = self.engine.now(conn) - timedelta(seconds=policy.retain)
            oldest = target.oldest(conn, cutoff)
        return max(0.0, (cutoff - oldest).total_seconds()) if oldest else 0.0

    def preview(self, name: str, cutoff: datetime | None = None, *, limit: int = 10) -> PlanPreview:
        """Dry-run: what a run would do, by the same statements; mutates nothing."""
        policy, target = self.policy(name), self.target(name)
        engine = self.engine
        with engine.transaction() as conn:
            if engine.dialect == "postgres":
                conn.execute("set transaction read only")
            if cutoff is None:
                cutoff = engine.now(conn).replace(microsecond=0) - timedelta(seconds=policy.retain)
            target.storage = storage = target.detect(conn)  # as a run would read it now
            candidates = target.count(conn, cutoff)
            windows: list[int] = []
            bounds = target.bounds(conn, cutoff, storage)
            if bounds:
                after = bounds[0] - 1
                while page := target.plan_page(
                    conn, cutoff, after, bounds[1], defaults.PLAN_PAGE, storage
                ):
                    windows += page
                    after = page[-1] + policy.window
                    if len(page) < defaults.PLAN_PAGE:
                        break
        return PlanPreview(
            name,
            cutoff,
            candidates,
            len(windows),
            [(lo, lo + policy.window) for lo in windows[:limit]],
            storage.describe(),
        )


def _plan_job(policy: Policy, rid: str, cutoff: datetime) -> NewJob:
    """A run's first planning job, keyed by the run."""
    return new_job(
        PLAN,
        {"policy": policy.name, "run_id": rid, "cutoff": format_time(cutoff)},
        key=f"{rid}:plan",
        max_attempts=policy.max_attempts,
        priority=policy.priority,
    )


def _window_job(policy: Policy, run: dict[str, Any], lo: int, storage: Storage) -> NewJob:
    """The window (lo, lo + window] of a run, keyed policy:cutoff:lo, with the
    storage its planner read."""
    fields = {k: run[k] for k in ("policy", "run_id", "cutoff")}
    return new_job(
        WINDOW,
        {**fields, "lo": lo, "hi": lo + policy.window, "storage": storage.token},
        key=f"{run['run_id']}:{lo}",
        max_attempts=policy.max_attempts,
        priority=policy.priority,
    )


def _storage(payload: dict[str, Any], target: Target) -> Storage:
    """The storage a run's planner read, carried by its jobs (jobs queued before
    runs carried it use the storage of the process's check)."""
    token = payload.get("storage")
    return Storage.from_token(token) if token else target.storage


def handlers(cleanup: Callable[[], Cleanup]) -> list[Handler]:
    """The built-in planning and window jobs, over the Cleanup that ``cleanup``
    returns (the App builds it on first use). The window job completes its own
    job in its one statement (handlers.py's private modes)."""
    return [
        Handler(
            PLAN,
            lambda job, tx: cleanup().plan_page(job, tx),
            after=lambda job, windows, seconds: cleanup().after_plan(job, windows, seconds),
            after_batch=lambda jobs: cleanup().finish_batch(jobs),
        ),
        Handler(
            WINDOW,
            lambda job, tx: cleanup().apply_window(job, tx),
            before=lambda job: cleanup().before_window(job),
            after=lambda job, result, seconds: cleanup().after_window(job, result, seconds),
            after_batch=lambda jobs: cleanup().finish_batch(jobs),
            completes_job=True,
            statement=True,
        ),
    ]
