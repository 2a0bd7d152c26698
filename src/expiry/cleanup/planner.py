"""The planning job: a run's pages of windows. The first page starts the run
(its turn among the policy's runs, its strategy and storage read from the
data); each page queues its windows and the next page."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from .. import defaults
from ..config import Config, Policy
from ..engines import Engine
from ..errors import PermanentError, SchemaError, Snooze
from ..queue.jobs import new_job, policy_queue
from ..times import parse_time
from ..timestamps import Storage
from ..types import UNFINISHED_STATES, AuditAction, Job, Partition
from . import approval
from .jobs import partition_job, plan_job, storage_of, window_job
from .policies import Policies
from .runs import PARTITION, PLAN, Runs
from .target import Target
from .windows import BLOCK, BLOCKS, KEY, LAST_ADDRESS, TIME, Span

log = logging.getLogger("expiry.cleanup")


OVERLAP_WAIT_SECONDS = 5.0


PARTITION_WAIT_SECONDS = 2.0  # partition jobs are quick: the windows' page waits this long for them


class Planner(Policies):
    """The planning job's handler."""

    def __init__(self, engine: Engine, config: Config, runs: Runs | None = None) -> None:
        super().__init__(engine, config, runs)
        self._page_ceilings: dict[str, int] = {}
        """Per policy, in this process (every later run too, until a restart):
        the most windows a planning page may hold since a Galera cluster
        refused a larger page's write set."""

    def plan_page(self, job: Job, tx: Any) -> int:
        """Emit one page of windows and, unless it was the last, the next page.
        A run's first planning job reads the column's storage and queues the
        expired partitions (if any, ahead of the windows); the windows' first
        page then chooses the run's windows and checks a sample."""
        with self._drift(job.payload["policy"]):
            return self._plan_page(job, tx)

    def _plan_page(self, job: Job, tx: Any) -> int:
        p = job.payload
        self.usable(p["policy"], tx)
        policy, target = self.policy(p["policy"]), self.target(p["policy"], tx)
        cutoff = parse_time(p["cutoff"])
        first_page = "windows" not in p
        if "storage" in p:  # past the run's first planning job, its approval's gate
            self.approval_stands(policy, p, job.key)
        try:
            if "storage" not in p:
                opened = self._start_run(policy, target, p, cutoff, tx)
                if opened is None:
                    return 0
                p = opened
            if first_page:
                begun = self._begin_windows(policy, target, p, cutoff, tx)
                if begun is None:
                    return 0
                p = begun
        except SchemaError as exc:
            raise PermanentError(str(exc)) from exc
        storage = storage_of(p, target)
        page = self._page_size(policy, p["windows"], first_page)
        with self._lock:  # under a page the cluster refused (plan_failed)
            page = min(page, self._page_ceilings.get(policy.name, page))
        if p["windows"] == TIME:
            spans, cursor = self._time_page(target, p, cutoff, page, tx, storage)
        elif p["windows"] == BLOCKS:
            spans, cursor = self._blocks_page(target, p, page)
        else:
            spans, cursor = self._key_page(target, p, cutoff, page, tx, storage)
        jobs = [window_job(policy, p, span) for span in spans]
        if cursor is not None:
            # Planning keeps ahead of the deletes: the next page's job is queued
            # (claimed) before this page's second half, or before all of a run's
            # short first page, so one worker plans it while the others delete
            # instead of every worker waiting for it after the last window.
            jobs.insert(0 if first_page else len(jobs) // 2, plan_job(policy, p, cursor))
        # The run's row first: a cancelled run queues nothing more.
        if not self.engine.run_add_windows(p["run_id"], len(spans), done=cursor is None, conn=tx):
            log.info(
                "run cancelled: planning stops", extra={"policy": policy.name, "run": p["run_id"]}
            )
            return 0
        self.engine.job_insert_many(jobs, tx)
        return len(spans)

    @staticmethod
    def _page_size(policy: Policy, windows: str, first_page: bool) -> int:
        """Windows per planning page: time pages also read at most TIME_PAGE_ROWS.
        (At most the policy's page ceiling: plan_failed.)"""
        page = defaults.PLAN_PAGE
        if windows == TIME:
            page = max(1, min(page, defaults.TIME_PAGE_ROWS // policy.window))
        return min(defaults.FIRST_PLAN_PAGE, page) if first_page else page

    def _key_page(
        self,
        target: Target,
        p: dict[str, Any],
        cutoff: datetime,
        page: int,
        tx: Any,
        storage: Storage,
    ) -> tuple[list[Span], dict[str, Any] | None]:
        window = target.policy.window
        los = target.plan_page(tx, cutoff, p["after"], p["max"], page, storage)
        spans = [Span.keys(lo, lo + window) for lo in los]
        more = len(los) == page
        return spans, ({"after": los[-1] + window, "max": p["max"]} if more else None)

    def _blocks_page(
        self, target: Target, p: dict[str, Any], page: int
    ) -> tuple[list[Span], dict[str, Any] | None]:
        """Block windows by arithmetic: ``step`` blocks each from ``after`` to the
        table's pages when the run began; the last is open-ended (rows moved or
        added past the end since)."""
        after, pages, step = p["after"], p["max"], p["step"]
        spans = []
        for block in range(after, max(pages, after + 1), step)[:page]:
            upper = block + step
            spans.append(
                Span.blocks(block * BLOCK, LAST_ADDRESS if upper >= pages else upper * BLOCK)
            )
        last = spans[-1].hi == LAST_ADDRESS
        return spans, (
            None if last else {"after": after + len(spans) * step, "max": pages, "step": step}
        )

    def _time_page(
        self,
        target: Target,
        p: dict[str, Any],
        cutoff: datetime,
        page: int,
        tx: Any,
        storage: Storage,
    ) -> tuple[list[Span], dict[str, Any] | None]:
        after = None if p.get("after") is None else tuple(p["after"])
        uppers = target.time_page(tx, cutoff, after, page, storage)
        spans, lower = [], after
        for upper in uppers:
            spans.append(Span.positions(lower, upper))
            lower = upper
        more = len(uppers) == page
        return spans, ({"after": list(uppers[-1])} if more else None)

    def _start_run(
        self, policy: Policy, target: Target, p: dict[str, Any], cutoff: datetime, tx: Any
    ) -> dict[str, Any] | None:
        """A run's first planning job: wait for an earlier run of the policy and
        read the column's storage, once, from the data as it is now (every job of
        the run compares in that domain). Whole expired partitions are queued
        first, with the windows' first page after them; returns None then, else
        the payload that plans the windows now."""
        # A run that needs an approval supersedes the started runs it covers
        # only once approved (below): one never approved cancels nothing begun.
        if not self._take_turn(policy, p["run_id"], tx, started=not policy.approve):
            return None
        storage = target.detect(tx)
        p = {**p, "storage": storage.token}
        parts = target.expired_partitions(tx, cutoff, storage)
        if policy.approve:
            if not self._approved(policy, target, p, cutoff, storage, parts, tx):
                self.engine.run_add_windows(p["run_id"], 0, done=True, conn=tx)
                return None
            if not self._take_turn(policy, p["run_id"], tx):  # approved: its full turn
                return None
            p = {**p, "approved": approval.policy_hash(policy)}  # on every job of the run
        if not parts:
            return p
        mode = target.partition_mode()
        jobs = [partition_job(policy, p, part, mode) for part in parts]
        jobs.append(
            new_job(
                PLAN,
                {**p, "stage": "after-partitions"},
                key=f"{p['run_id']}:plan:windows",
                max_attempts=policy.max_attempts,
                priority=policy.priority,
                queue=policy_queue(policy.name),
            )
        )
        if self.engine.run_add_windows(p["run_id"], len(parts), done=False, conn=tx):
            self.engine.job_insert_many(jobs, tx)
        return None

    def _approved(
        self,
        policy: Policy,
        target: Target,
        p: dict[str, Any],
        cutoff: datetime,
        storage: Storage,
        parts: list[Partition],
        tx: Any,
    ) -> bool:
        """A run of a policy with ``approve = true``, before it removes anything:
        True once approved; False when its wait for approval ran out; else it
        snoozes awaiting approval, its preview audited (cleanup/approval.py)."""

        def preview() -> dict[str, Any]:  # read only for a new preview
            sample = target.sample_check(tx, cutoff, storage)
            return {
                "cutoff": p["cutoff"],
                "candidates": target.count(tx, cutoff, storage),
                "sample": sample[: approval.SAMPLE_KEYS],
                "held": target.kept_by_holds(tx, cutoff, storage),
                "partitions": [f"{x.schema}.{x.name}" for x in parts],
            }

        try:
            return approval.gate(self.engine, policy, p["run_id"], preview, tx)
        except Snooze as snooze:
            # The snooze rolls back this transaction, its turn's effects with it:
            # the earlier runs not yet started that it supersedes are superseded
            # again once the job waits, so that no run awaiting approval holds up
            # a later one (one that started waits: an unapproved run never
            # cancels what an approved one began).
            audit = snooze.then

            def then() -> None:
                with self.engine.transaction() as turn:
                    try:
                        mine = self._take_turn(policy, p["run_id"], turn, started=False)
                    except Snooze:
                        mine = True  # an earlier run moves again: it waits its turn
                if mine and audit is not None:
                    audit()

            snooze.then = then
            raise

    def _take_turn(self, policy: Policy, rid: str, tx: Any, *, started: bool = True) -> bool:
        """Whether run ``rid`` (about to start) plans now. The policy's runs go in
        turn, by cutoff then id, and a run waits only for an earlier one that is
        moving (a job of it running or due): no two ever wait for each other,
        and none waits on a retry's backoff. An earlier run this one covers
        gives way to it (superseded: its waiting jobs cancelled, finished,
        audited; the later cutoff deletes every row it would have): each run
        not yet started, so N runs queued behind one become one, and each that
        started but only waits (windows backing off behind a held row lock, a
        full disk); with ``started=False`` only those not yet started. False:
        this run gave way, or was cancelled meanwhile. Raises Snooze, naming
        the run it waits for."""
        turns = self.engine.run_turns(policy.name, conn=tx)
        mine = next((t for t in turns if t.id == rid), None)
        if mine is None:  # cancelled or superseded since its job was queued
            return False
        newest = [t for t in turns if not t.started][-1:]
        if newest and newest[0].id != rid and not mine.started:
            self._supersede(policy, rid, newest[0].id, tx)
            self.engine.job_wake(f"{newest[0].id}:plan", conn=tx)  # its turn, now
            return False
        order = (mine.cutoff, mine.id)
        earlier = [t for t in turns if (t.cutoff, t.id) < order]
        moving = [t for t in earlier if t.started and t.active]
        if moving:
            raise Snooze(
                OVERLAP_WAIT_SECONDS,
                f"waiting for run {moving[-1].id}: {moving[-1].pending} of its jobs are pending",
            )
        for covered in earlier:
            if not covered.started or (started and covered.pending):
                self._supersede(policy, covered.id, rid, tx)
        return True

    def _supersede(self, policy: Policy, rid: str, by: str, tx: Any) -> None:
        """Run ``rid`` gives way to the later run ``by``: its waiting jobs are
        cancelled and it finishes (now, or after its job running now), audited."""
        cancelled = self.engine.run_cancel(rid, "expiry", superseded_by=by, conn=tx)
        if cancelled is None:  # finished or cancelled meanwhile
            return
        self.engine.run_finish(rid, conn=tx)
        self.engine.audit_append(
            tx,
            AuditAction.RUN_SUPERSEDED,
            actor="expiry",
            policy=policy.name,
            run_id=rid,
            detail={"superseded_by": by, "jobs_cancelled": len(cancelled)},
        )
        log.info("run superseded by %s", by, extra={"policy": policy.name, "run": rid})

    def _begin_windows(
        self, policy: Policy, target: Target, p: dict[str, Any], cutoff: datetime, tx: Any
    ) -> dict[str, Any] | None:
        """The windows' first page: after the run's partitions are gone, choose
        the run's windows and check a sample of candidates before any window
        exists. Returns the payload that plans them, or None when nothing is
        expired (the run is then planned)."""
        rid = p["run_id"]
        if p.get("stage") == "after-partitions":
            self._await_partitions(rid, tx)
        storage = storage_of(p, target)
        strategy = target.choose(tx, cutoff, storage)
        start: dict[str, Any] | None = None
        if strategy.name == KEY:
            bounds = strategy.bounds or target.bounds(tx, cutoff, storage)
            if bounds is not None:
                start = {"after": bounds[0] - 1, "max": bounds[1]}
        elif target.oldest(tx, cutoff, storage) is None:
            pass
        elif strategy.name == BLOCKS:
            pages, step = target.plan_blocks(tx, cutoff, storage)
            start = {"after": 0, "max": pages, "step": step}
        else:
            start = {"after": None}
        if start is None:
            self.engine.run_add_windows(rid, 0, done=True, conn=tx)
            return None
        target.sample_check(tx, cutoff, storage)
        log.info(strategy.describe(), extra={"policy": policy.name, "run": rid})
        p = {k: v for k, v in p.items() if k != "stage"}
        return {**p, "windows": strategy.name, **start}

    def _await_partitions(self, rid: str, tx: Any) -> None:
        """Wait for the run's partition jobs: they take milliseconds each, so this
        job looks again every few milliseconds (each statement of its
        transaction sees what committed since: PostgreSQL's read committed,
        the only engine with partitions) for up to PARTITION_WAIT_SECONDS, then
        snoozes. A snooze alone would leave it to the idle workers' next poll."""
        deadline = time.monotonic() + PARTITION_WAIT_SECONDS
        while True:
            waiting = sum(
                j.n
                for j in self.engine.run_jobs(rid, conn=tx)
                if j.handler == PARTITION and j.state in UNFINISHED_STATES
            )
            if not waiting:
                return
            if time.monotonic() >= deadline:
                raise Snooze(PARTITION_WAIT_SECONDS, f"{waiting} partitions are being removed")
            time.sleep(0.005)

    def plan_failed(self, job: Job, kind: str) -> None:
        """A planning page's attempt failed: one a Galera cluster refused for its
        write set's size (its window jobs' rows over wsrep_max_ws_rows, or their
        bytes over wsrep_max_ws_size) halves the policy's pages from the size it
        tried, for its retry and every later page (no attempt spent:
        queue/runner.py)."""
        if kind != "write_set_limit":
            return
        p = job.payload
        policy = self.policy(p["policy"])
        base = self._page_size(policy, p.get("windows", KEY), "windows" not in p)
        with self._lock:
            tried = min(base, self._page_ceilings.get(policy.name, base))
            self._page_ceilings[policy.name] = max(1, tried // 2)

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
