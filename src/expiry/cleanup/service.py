"""The cleanup core: runs, the planner's pages and the window job.

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

Overlap: a run whose policy still has pending jobs from an earlier run waits
(its planning job snoozes) until they finish; the later cutoff then covers
whatever the earlier run would have deleted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import Histogram

from .. import defaults
from ..config import Config, Policy
from ..engines import Engine
from ..errors import (
    CutoffRefused,
    ForeignKeyBlocked,
    KeyConflict,
    PermanentError,
    SchemaError,
    Snooze,
    TransientError,
)
from ..queue.handlers import Handler
from ..queue.jobs import new_job, policy_queue
from ..times import format_duration, format_time, parse_time
from ..timestamps import Storage
from ..types import UNFINISHED_STATES, AuditAction, Gates, Job, NewJob, Partition
from .runs import PARTITION, PLAN, VACUUM, WINDOW, Runs
from .target import Target
from .windows import BLOCK, BLOCKS, KEY, LAST_ADDRESS, TIME, Position, Span, address, position_name

log = logging.getLogger("expiry.cleanup")

WINDOW_ROWS = Histogram(
    "expiry_window_rows",
    "Rows deleted or archived per window transaction",
    ["policy"],
    buckets=(0, 1, 10, 100, 1000, 5000, 10000, 50000, 100000),
)
MIN_CHUNK = 100
MAX_REST_SECONDS = 2.0  # a nice_ratio rest never outlasts this
OVERLAP_WAIT_SECONDS = 5.0
QUARANTINE_WAIT_SECONDS = 30.0  # a quarantined policy's jobs look again this often
PARTITION_WAIT_SECONDS = 2.0  # partition jobs are quick: the windows' page waits this long for them


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
    timed_out: bool = False
    """Its delete timed out and the window was split, or its row kept, instead
    (the policy's keys per transaction were halved then)."""

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
    first_windows: list[Span]
    """The first windows."""
    storage: str = ""
    """How the timestamp column stores time and the zone its naive values are
    read in, with its oldest and newest values beside now, as this preview read it."""
    strategy: str = ""
    """The windows a run would use now, and why."""
    partitions: list[dict[str, Any]] = field(default_factory=list)
    """Whole partitions a run would drop or detach now, with their row estimates
    (their rows are counted among the candidates and windows too)."""
    warnings: list[str] = field(default_factory=list)
    """What looks wrong in how the column is read (values that look shifted by a zone)."""


@dataclass(frozen=True)
class _Part:
    """The part of a window job's span that this attempt takes, the rest that
    it queues as a continuation (None: all of it), and the candidates the part
    held when it was cut (None: not counted)."""

    span: Span
    rest: Span | None = None
    rows: int | None = None
    held: str | None = None
    """The rest follows a row another transaction holds (the database's words for
    the lock wait): it probes first (_around_held)."""


@dataclass
class _Pace:
    """Per policy, per process: keys per transaction, and when its next window
    may start (the rest after the last one: monotonic seconds)."""

    chunk: int
    not_before: float = 0.0
    """No window is claimed before this: the rest after the last one."""
    rate_until: float = 0.0
    """No window starts before this (max_rows_per_second's share of the rows
    already taken): a window claimed earlier goes back to the queue until then."""
    lock: threading.Lock = field(default_factory=threading.Lock)


class Cleanup:
    def __init__(self, engine: Engine, config: Config, runs: Runs | None = None) -> None:
        self.engine = engine
        self.config = config
        self.runs = runs or Runs(engine)
        self._targets: dict[str, Target] = {}
        self._paces: dict[str, _Pace] = {}
        self._probes_refused: set[str] = set()
        self._referenced: set[str] = set()
        """Policies a window of which met rows that other tables reference:
        their windows leave such rows out from the start in this process."""
        self._lock = threading.Lock()
        self.observer: Callable[[str, float], None] | None = None
        """Told (policy, seconds) after each window (the throttle's rate)."""
        self._watermarks: dict[str, float] = {}
        self.broken: dict[str, str] = {}
        """Quarantined policies: name -> why its check failed. Each is checked
        again on its next use (a repaired table, a reloaded config): the others
        run meanwhile."""

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
        with self._lock:
            self.broken.clear()

    # -- the schema check ---------------------------------------------------------

    def target(self, name: str, conn: Any | None = None) -> Target:
        """The policy's table, checked against the live schema once per process."""
        with self._lock:
            target = self._targets.get(name)
        if target is None:
            target = Target(self.engine, self.policy(name))
            try:
                with self.engine.transaction_or(conn) as tx:
                    warnings = target.check(tx)
            except SchemaError as exc:
                self._quarantine(name, exc)
                raise
            for warning in warnings:
                log.warning(warning)
            self._repaired(name, target)
        return target

    def usable(self, name: str, conn: Any | None = None) -> None:
        """Before a job of policy ``name``: its table checked (once per
        process). A quarantined policy's jobs wait (Snooze: no attempt spent)
        until it is repaired, rather than dying or stopping the others."""
        try:
            self.target(name, conn)
        except SchemaError as exc:
            raise Snooze(QUARANTINE_WAIT_SECONDS, f"policy quarantined: {exc}") from exc

    def _quarantine(self, name: str, exc: SchemaError, *, quiet: bool = False) -> None:
        """Mark the policy broken: its table is checked again at its next use
        (the check that passed before no longer holds)."""
        with self._lock:
            new = self.broken.get(name) != str(exc)
            self.broken[name] = str(exc)
            self._targets.pop(name, None)
        if new and not quiet:  # one line per change, not per use
            log.error("policy quarantined: %s", exc, extra={"policy": name})

    def _repaired(self, name: str, target: Target) -> None:
        """The policy's check passed: it is usable again (said once, if it was not)."""
        with self._lock:
            self._targets[name] = target
            was = self.broken.pop(name, None)
        if was is not None:
            log.info("policy repaired: its jobs run again", extra={"policy": name})

    @contextmanager
    def _drift(self, name: str, *, job: bool = True) -> Iterator[None]:
        """Around statements on the policy's table: a table or column that went
        missing under a running process (renamed, dropped, altered) quarantines
        the policy. A job then waits (Snooze: no attempt spent, nothing
        dead-lettered) until the table fits again; a reader (``job=False``)
        gets the SchemaError."""
        try:
            yield
        except Exception as exc:
            if not self.engine.schema_drift(exc):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            broken = SchemaError(f"policy {name!r}: its table changed under expiry: {first}")
            self._quarantine(name, broken)
            if not job:
                raise broken from exc
            raise Snooze(QUARANTINE_WAIT_SECONDS, f"policy quarantined: {broken}") from exc

    def forget_targets(self) -> None:
        """After a config reload: check each policy's table again on next use."""
        with self._lock:
            self._targets.clear()
            self._paces.clear()

    def check(self) -> list[str]:
        """Check every policy now; raises SchemaError naming every policy that
        does not fit (`expiry check` exits 2), after checking them all."""
        warnings, broken = self.check_all(quiet=True)  # the caller reports them
        if broken:
            raise SchemaError("; ".join(broken.values()))
        return warnings

    def check_all(self, *, quiet: bool = False) -> tuple[list[str], dict[str, str]]:
        """Check every policy now: the warnings of those that fit, and the
        reason of each that does not, which is quarantined (the worker, the
        scheduler and the server go on with the others)."""
        warnings: list[str] = []
        for policy in self.policies:
            target = Target(self.engine, policy)
            try:
                with self.engine.read_transaction() as conn:  # a check writes nothing
                    warnings += target.check(conn)
                    if target.fixed is None:  # the data decides: as a run would now
                        latest = self.engine.now(conn) - timedelta(seconds=policy.retain)
                        target.notes.insert(0, target.choose(conn, latest).describe() + " (now)")
            except SchemaError as exc:
                self._quarantine(policy.name, exc, quiet=quiet)
                continue
            self._repaired(policy.name, target)
        with self._lock:
            return warnings, dict(self.broken)

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
                [planned] = engine.job_insert_many([_first_plan_job(policy, rid, cutoff)], tx)
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

    # -- the planning job -------------------------------------------------------

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
        storage = _storage(p, target)
        if p["windows"] == TIME:
            spans, cursor = self._time_page(target, p, cutoff, first_page, tx, storage)
        elif p["windows"] == BLOCKS:
            spans, cursor = self._blocks_page(target, p, first_page)
        else:
            spans, cursor = self._key_page(target, p, cutoff, first_page, tx, storage)
        jobs = [_window_job(policy, p, span) for span in spans]
        if cursor is not None:
            # Planning keeps ahead of the deletes: the next page's job is queued
            # (claimed) before this page's second half, or before all of a run's
            # short first page, so one worker plans it while the others delete
            # instead of every worker waiting for it after the last window.
            jobs.insert(0 if first_page else len(jobs) // 2, _plan_job(policy, p, cursor))
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
        """Windows per planning page: time pages also read at most TIME_PAGE_ROWS."""
        page = defaults.PLAN_PAGE
        if windows == TIME:
            page = max(1, min(page, defaults.TIME_PAGE_ROWS // policy.window))
        return min(defaults.FIRST_PLAN_PAGE, page) if first_page else page

    def _key_page(
        self,
        target: Target,
        p: dict[str, Any],
        cutoff: datetime,
        first: bool,
        tx: Any,
        storage: Storage,
    ) -> tuple[list[Span], dict[str, Any] | None]:
        window, page = target.policy.window, self._page_size(target.policy, KEY, first)
        los = target.plan_page(tx, cutoff, p["after"], p["max"], page, storage)
        spans = [Span.keys(lo, lo + window) for lo in los]
        more = len(los) == page
        return spans, ({"after": los[-1] + window, "max": p["max"]} if more else None)

    def _blocks_page(
        self, target: Target, p: dict[str, Any], first: bool
    ) -> tuple[list[Span], dict[str, Any] | None]:
        """Block windows by arithmetic: ``step`` blocks each from ``after`` to the
        table's pages when the run began; the last is open-ended (rows moved or
        added past the end since)."""
        page = self._page_size(target.policy, BLOCKS, first)
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
        first: bool,
        tx: Any,
        storage: Storage,
    ) -> tuple[list[Span], dict[str, Any] | None]:
        page = self._page_size(target.policy, TIME, first)
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
        if not self._take_turn(policy, p["run_id"], tx):
            return None
        storage = target.detect(tx)
        p = {**p, "storage": storage.token}
        parts = target.expired_partitions(tx, cutoff, storage)
        if not parts:
            return p
        mode = target.partition_mode()
        jobs = [_partition_job(policy, p, part, mode) for part in parts]
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

    def _take_turn(self, policy: Policy, rid: str, tx: Any) -> bool:
        """Whether run ``rid`` (about to start) plans now. The policy's runs go in
        turn, by cutoff then id, and a run waits only for an earlier one that is
        moving (a job of it running or due): no two ever wait for each other,
        and none waits on a retry's backoff. An earlier run this one covers
        gives way to it (superseded: its waiting jobs cancelled, finished,
        audited; the later cutoff deletes every row it would have): each run
        not yet started, so N runs queued behind one become one, and each that
        started but only waits (windows backing off behind a held row lock, a
        full disk). False: this run gave way, or was cancelled meanwhile.
        Raises Snooze, naming the run it waits for."""
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
            if not covered.started or covered.pending:
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
        storage = _storage(p, target)
        strategy = target.choose(tx, cutoff, storage)
        start: dict[str, Any] | None = None
        if strategy.name == KEY:
            bounds = target.bounds(tx, cutoff, storage)
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
        statement mode). A window cut short by pacing, or after its attempts
        timed out (_paced), enqueues its rest in the same transaction, opened
        for the two. The ledger row is the window's record (range, rows, worker,
        time); only a duplicate delivery is audited. A window a foreign key
        refuses is split (_blocked); so is one that times out at its last
        chance (_timed_out)."""
        with self._drift(job.payload["policy"]):
            return self._apply_window(job, tx)

    def _apply_window(self, job: Job, tx: Any) -> WindowResult:
        p = job.payload
        policy, target = self.policy(p["policy"]), self.target(p["policy"], tx)
        cutoff, storage, span = parse_time(p["cutoff"]), _storage(p, target), Span.of(p)
        try:
            halvings = self._halvings(job)
            part, probed = _Part(span), False
            try:
                if self._probes_held(job):
                    probed = True
                    around = self._around_held(job, tx, span, cutoff, storage)
                    if around is not None:
                        return around
                part = self._paced(target, span, cutoff, tx, storage, halvings)
                taken = self._take(job, tx, part, cutoff, storage, halvings)
            except Exception as exc:
                kind = self.engine.classify(exc)[1]
                if kind not in self.engine.window_timeouts:
                    raise
                words = _database_words(exc)
                if kind == "lock_timeout":
                    words += self._behind(policy)
                reason = self._timed_out(job, part, halvings, exc, words)
                if reason is None:  # the next attempt, smaller or cut, comes soon
                    raise TransientError(
                        words
                        + (
                            HELD_RETRY
                            if kind == "lock_timeout" and not probed
                            else ": retried with half the rows"
                        ),
                        kind=kind,
                        retry_within=defaults.SHRINK_RETRY_SECONDS,
                        spend=False,
                    ) from exc
                return self._blocked(
                    job,
                    tx,
                    part.span,
                    cutoff,
                    storage,
                    reason,
                    rest=part.rest,
                    timed_out=True,
                    halvings=halvings,
                )
        except ForeignKeyBlocked as exc:
            reason = str(exc).splitlines()[0]
            around = self._around_referenced(job, tx, span, cutoff, storage)
            if around is not None:
                return around
            return self._blocked(job, tx, span, cutoff, storage, reason)
        except SchemaError as exc:
            raise PermanentError(str(exc)) from exc
        return WindowResult(policy.name, taken)

    def _take(
        self, job: Job, tx: Any, part: _Part, cutoff: datetime, storage: Storage, halvings: int
    ) -> int | None:
        """Apply ``part`` of the window under the job's key, completing the job,
        and queue its rest: the rows taken, or None for a duplicate delivery.
        A part taken after ``halvings`` timeouts hands its rest one halving
        fewer (_rest_job)."""
        p = job.payload
        policy, target = self.policy(p["policy"]), self.target(p["policy"], tx)
        skip = policy.name in self._referenced and target.skips_referenced
        with self.engine.atomic(tx) if part.rest is not None or skip else nullcontext():
            taken = target.apply(
                tx,
                cutoff,
                part.span,
                key=job.key,
                run_id=p["run_id"],
                worker=job.lease_owner,
                job=job,  # completed in the same statement (PostgreSQL) or transaction
                storage=storage,
                unreferenced=skip,
            )
            if skip and taken is not None:
                self._book_referenced(job, tx, target, part.span, cutoff, storage)
            # The delivery that booked the window's first part enqueues the rest.
            if part.rest is not None and taken is not None:
                rest = _rest_job(policy, p, part.rest, halvings, held=part.held)
                self.engine.job_insert_many([rest], tx)
        return taken

    def _halvings(self, job: Job) -> int:
        """How many times this attempt halves the window: the halvings its
        parent handed it (_rest_job), and one for each of its own last
        attempts, one after another, that ended in a timeout of its statement
        (statement_timeout, lock_timeout: the engine's window_timeouts)."""
        count = int(job.payload.get("halvings", 0))
        for error in reversed(job.errors):
            if error.get("kind") not in self.engine.window_timeouts:
                break
            count += 1
        return count

    def _probes_held(self, job: Job) -> bool:
        """Whether this attempt first asks which of its rows another transaction
        holds (_around_held): its last attempt waited out the policy's
        lock_timeout, or it is the rest of a window cut around a held row. Not
        after an attempt whose cut waited out the lock again: that one halves,
        as after any timeout, so that the window ends whatever the locks."""
        if "lock_timeout" not in self.engine.window_timeouts:
            return False  # no row locks (SQLite: one writer at a time)
        if job.errors:
            last = job.errors[-1]
            return last.get("kind") == "lock_timeout" and str(last.get("error", "")).endswith(
                HELD_RETRY
            )
        return bool(job.payload.get("held"))

    def _around_held(
        self, job: Job, tx: Any, span: Span, cutoff: datetime, storage: Storage
    ) -> WindowResult | None:
        """After a lock wait ran out: cut the window at once around the first
        candidate another transaction holds, where halving would wait out one
        lock_timeout a halving (log2(window) of them for each held row, and a
        run as long as the lock). The free candidates before it are taken; a
        held first candidate is kept and booked as blocked, without another
        wait; the rest of the window follows as a job that probes again. The
        probe's row locks end with it (engine.scratch), so no live transaction
        waits on the rest of the window meanwhile (InnoDB keeps them to the
        commit); a row locked between the probe and the delete costs one more
        lock wait, then halving. None when nothing is held now, or when the
        role may not lock the table's rows (SELECT ... FOR UPDATE needs the
        UPDATE privilege on PostgreSQL): the attempt goes on as the halving
        would."""
        p, policy = job.payload, self.policy(job.payload["policy"])
        target = self.target(p["policy"], tx)
        words = _lock_words(job)
        with self.engine.atomic(tx):
            self.engine.session_limits(
                tx,
                f"{int(policy.lock_timeout * 1000)}ms",
                f"{int(policy.statement_timeout * 1000)}ms",
            )
            try:
                with self.engine.scratch(tx):
                    order, held = target.held(tx, cutoff, span, storage)
            except Exception as exc:
                if self.engine.classify(exc)[1] != "insufficient_privilege":
                    raise
                self._probe_refused(job, exc)
                return None
            locked = set(held)
            if self.engine.next_key_reads:  # the row before a held one waits on it too
                marked = {i for i, p in enumerate(order) if p in locked}
                held = [p for i, p in enumerate(order) if i in marked or i + 1 in marked]
            if not held:
                return None
            first = order.index(held[0])
            if first == 0:
                part, rest = (span, None) if held[0] == span.hi else span.split(held[0])
                limit = format_duration(policy.lock_timeout)
                whose = (
                    "held by another transaction"
                    if held[0] in locked
                    else "next to a row another transaction holds"
                )
                reason = f"{words} (lock_timeout {limit}; {whose})"
                return self._blocked(
                    job, tx, part, cutoff, storage, reason, rest=rest, timed_out=True, held=words
                )
            part, rest = span.split(order[first - 1])
            taken = self._take(job, tx, _Part(part, rest, first, held=words), cutoff, storage, 0)
        return WindowResult(policy.name, taken, timed_out=True)

    def _around_referenced(
        self, job: Job, tx: Any, span: Span, cutoff: datetime, storage: Storage
    ) -> WindowResult | None:
        """After a foreign key refused the window's delete: apply it again at
        once without the rows other tables reference (one statement more, not
        a split into two jobs a halving, 2,000 jobs a run for 1,000 such rows),
        and count those kept in its ledger row. The policy's later windows in
        this process leave them out from the start. None when the table has no
        such reference (a reference to itself), or the delete is refused
        again (a reference added meanwhile): then the window is split."""
        policy, target = self.policy(job.payload["policy"]), self.target(job.payload["policy"])
        if not target.skips_referenced:
            return None
        first = policy.name not in self._referenced
        self._referenced.add(policy.name)
        try:
            taken = self._take(job, tx, _Part(span), cutoff, storage, 0)
        except ForeignKeyBlocked:
            return None
        if first:
            log.warning(
                "window met rows that other tables reference: they are kept and counted, "
                "and the policy's windows leave them out from now on",
                extra={"policy": policy.name, "run": job.payload["run_id"], "job": job.key},
            )
        return WindowResult(policy.name, taken)

    def _book_referenced(
        self, job: Job, tx: Any, target: Target, span: Span, cutoff: datetime, storage: Storage
    ) -> None:
        """Count on the window's ledger row the expired rows its delete left out
        (other tables reference them), in the same transaction."""
        kept = target.count_span(tx, cutoff, span, storage)
        if kept:
            tables = ", ".join(sorted({ref.table for ref in target.restricting}))
            self.engine.ledger_keep(
                tx,
                job.key,
                kept,
                f"{kept} {'row' if kept == 1 else 'rows'} kept: referenced by rows of {tables}",
            )

    def _probe_refused(self, job: Job, exc: Exception) -> None:
        """Say once a process that a policy's role may not lock its rows, so
        its windows halve around held rows (a lock wait a halving)."""
        name = job.payload["policy"]
        if name in self._probes_refused:
            return
        self._probes_refused.add(name)
        log.warning(
            "this role may not lock the table's rows (%s): windows behind rows that other "
            "transactions hold are halved, one lock wait a halving, not cut around them at "
            "once (fix: grant update on the table to the role)",
            _database_words(exc),
            extra={"policy": name, "run": job.payload["run_id"], "job": job.key},
        )

    def _behind(self, policy: Policy) -> str:
        """Whom a lock wait on the policy's table waited behind, as the error
        says it: " (behind pid 4242: psql, idle in transaction, open 12.3 s:
        update sessions ...)"; nothing when none can be read (SQLite, or a
        failed read: the lock wait's own record matters more)."""
        try:
            holders = self.engine.lock_holders(policy.table)
        except Exception as exc:
            log.info("could not read who holds locks on %s: %s", policy.table, exc)
            return ""
        if not holders:
            return ""
        said = []
        for h in holders[:3]:
            opened = "" if h.seconds is None else f", transaction open {h.seconds:.1f} s"
            query = f": {h.query[:120]}" if h.query else ""
            said.append(f"pid {h.pid} ({h.application or '?'}, {h.state or '?'}{opened}){query}")
        more = f" and {len(holders) - 3} more" if len(holders) > 3 else ""
        return f" (behind {'; '.join(said)}{more})"

    def _timed_out(
        self, job: Job, part: _Part, halvings: int, exc: Exception, words: str
    ) -> str | None:
        """After the window's delete failed with ``exc`` (in ``words``): None to
        let the worker retry it (any other error; a timeout that the next,
        smaller attempt may pass), else why its rows are to be split or kept
        now: the part was one row already, or this was the job's last attempt.
        A timeout also halves the policy's keys per transaction, so the
        following windows start smaller."""
        kind = self.engine.classify(exc)[1]
        if kind not in self.engine.window_timeouts:
            return None
        policy = self.policy(job.payload["policy"])
        if kind == "statement_timeout":  # a size problem; a held row is not one
            pace = self._pace(policy)
            with pace.lock:
                pace.chunk = max(MIN_CHUNK, min(pace.chunk, policy.window) // 2)
        alone = halvings > 0 and part.rows is not None and part.rows <= 1
        if not alone and job.attempt < job.max_attempts:
            return None
        limit = policy.lock_timeout if kind == "lock_timeout" else policy.statement_timeout
        return f"{words} ({kind} {format_duration(limit)})"

    def _paced(
        self,
        target: Target,
        span: Span,
        cutoff: datetime,
        tx: Any,
        storage: Storage,
        halvings: int = 0,
    ) -> _Part:
        """The part of ``span`` this transaction takes, and the rest: by the
        policy's current keys (or rows) per transaction; after ``halvings``
        timeouts of the window in a row, the first 1/2**halvings of its
        candidates (at least one)."""
        if halvings:
            return self._shrunk(target, span, cutoff, tx, storage, halvings)
        chunk = self._pace(target.policy).chunk
        if chunk >= target.policy.window:
            return _Part(span)
        if span.strategy == KEY:
            upto = min(span.hi, span.lo + chunk)
            return _Part(span) if upto >= span.hi else _Part(*span.split(upto))
        middle = target.nth(tx, cutoff, span, chunk - 1, storage)
        if middle is None or middle == span.hi:
            return _Part(span)
        return _Part(*span.split(middle))

    @staticmethod
    def _shrunk(
        target: Target, span: Span, cutoff: datetime, tx: Any, storage: Storage, halvings: int
    ) -> _Part:
        """The first 1/2**halvings of ``span``'s candidates (rounded up), and the rest."""
        n = target.count_span(tx, cutoff, span, storage)
        rows = max(1, -(-n // 2 ** min(halvings, 62)))
        upto = target.nth(tx, cutoff, span, rows - 1, storage) if rows < n else None
        if upto is None or upto == span.hi:
            return _Part(span, None, n)
        part, rest = span.split(upto)
        return _Part(part, rest, rows)

    def _blocked(
        self,
        job: Job,
        tx: Any,
        span: Span,
        cutoff: datetime,
        storage: Storage,
        reason: str,
        *,
        rest: Span | None = None,
        timed_out: bool = False,
        halvings: int = 0,
        held: str | None = None,
    ) -> WindowResult:
        """A foreign key refused the window's delete, or it timed out one last
        time (_timed_out); nothing was taken. Its good rows are not thrown
        away: ``span`` is split in two halves of its candidates, queued (with
        ``rest``, a paced window's continuation) in the same transaction as its
        booking and its job's completion, each with attempts of its own, until
        the row at fault stands alone; that row is then kept and booked as
        blocked, with the reason (a later run tries it again)."""
        p, engine = job.payload, self.engine
        policy, target = self.policy(p["policy"]), self.target(p["policy"])
        with engine.atomic(tx):
            n = target.count_span(tx, cutoff, span, storage)
            middle = target.nth(tx, cutoff, span, (n + 1) // 2 - 1, storage) if n > 1 else None
            halves = span.split(middle) if middle is not None and middle != span.hi else None
            if halves is not None:
                booked = self._book_split(job, tx, span, halves)
            else:
                booked = self._book_kept(job, tx, span, cutoff, storage, reason if n else None)
            if booked and rest is not None:
                engine.job_insert_many([_rest_job(policy, p, rest, halvings, held=held)], tx)
            engine.job_complete(job, tx)
        _log_blocked(job, reason, split=halves is not None, timed_out=timed_out)
        return WindowResult(policy.name, 0 if booked else None, timed_out)

    def _book_split(self, job: Job, tx: Any, span: Span, halves: tuple[Span, Span]) -> bool:
        """Book the window as split and queue its halves (unless its run was
        cancelled); False when its key was booked before."""
        p, engine = job.payload, self.engine
        policy = self.policy(p["policy"])
        booked = engine.ledger_insert(
            tx,
            job.key,
            policy=policy.name,
            run_id=p["run_id"],
            worker=job.lease_owner,
            action="split",
            bounds=span.describe(),
        )
        if booked and engine.run_add_windows(p["run_id"], 1, done=False, conn=tx):
            jobs = [_span_job(policy, p, half, half.part_key) for half in halves]
            engine.job_insert_many(jobs, tx)
        return booked

    def _book_kept(
        self,
        job: Job,
        tx: Any,
        span: Span,
        cutoff: datetime,
        storage: Storage,
        reason: str | None,
    ) -> bool:
        """Book the window, whose one candidate is kept (``reason`` None: it holds
        none now), with nothing taken; False when its key was booked before."""
        p = job.payload
        policy, target = self.policy(p["policy"]), self.target(p["policy"])
        blocked = None
        if reason is not None:
            row = target.nth(tx, cutoff, span, 0, storage)
            if span.strategy == KEY:
                shown = f"{policy.key} {row}"
            elif span.strategy == BLOCKS and row is not None:
                shown = f"row at {address(row)}"
            else:
                shown = f"row at {row}"
            blocked = f"{shown}: {reason}"
        return self.engine.ledger_insert(
            tx,
            job.key,
            policy=policy.name,
            run_id=p["run_id"],
            worker=job.lease_owner,
            action=policy.action,
            bounds=span.describe(),
            blocked=blocked,
            kept=0 if blocked is None else 1,
        )

    # -- the partition job ----------------------------------------------------------

    def apply_partition(self, job: Job, tx: Any) -> WindowResult:
        """Detach (and drop) one whole expired partition, booked in the ledger in
        the same transaction with the rows it held, counted under the removal's
        lock (never the planner's estimate: the ledger is the evidence), under
        the policy's lock_timeout. The partition is read again from the catalog
        first: one no longer attached, or whose range no longer ends by the
        cutoff, is booked with nothing taken."""
        with self._drift(job.payload["policy"]):
            return self._apply_partition(job, tx)

    def _apply_partition(self, job: Job, tx: Any) -> WindowResult:
        p = job.payload
        self.usable(p["policy"], tx)
        policy, target = self.policy(p["policy"]), self.target(p["policy"], tx)
        cutoff, storage = parse_time(p["cutoff"]), _storage(p, target)
        part = p["partition"]
        name = f"{part['schema']}.{part['name']}"
        found = target.expired_partitions(tx, cutoff, storage, only=part["name"])
        current = next((x for x in found if x.schema == part["schema"]), None)
        rows = None
        if current is not None:
            try:  # the rows counted exactly under the removal's lock: the evidence
                rows = self.engine.partition_remove(
                    tx,
                    policy.table,
                    current,
                    drop=p["mode"] == "drop",
                    lock_timeout_ms=int(policy.partition_lock_timeout * 1000),
                )
            except SchemaError as exc:
                raise PermanentError(str(exc)) from exc
            except Exception as exc:
                if self.engine.classify(exc)[1] != "lock_timeout":
                    raise
                raise _partition_held(job, policy, name, exc) from exc
        # Booked after the removal, strictly: a concurrent delivery that removed
        # it first owns the key, and this transaction (its removal) rolls back.
        booked = self.engine.ledger_insert(
            tx,
            job.key,
            strict=rows is not None,
            policy=policy.name,
            run_id=p["run_id"],
            action=p["mode"],
            worker=job.lease_owner,
            bounds=f"partition {name}"
            + (" (rows counted)" if rows is not None else ": no longer an expired partition"),
            rows=rows or 0,
        )
        if not booked:
            return WindowResult(policy.name, None)
        return WindowResult(policy.name, rows or 0)

    def _pace(self, policy: Policy) -> _Pace:
        with self._lock:
            return self._paces.setdefault(policy.name, _Pace(chunk=policy.window))

    def gates(self) -> Gates:
        """What the worker holds back now: each policy's queue while the policy
        rests (the worker claims from the others meanwhile), and a paced
        policy's queue to one job a claim."""
        now = time.monotonic()
        with self._lock:
            paces = dict(self._paces)
        resting = {
            policy_queue(name): pace.not_before
            for name, pace in paces.items()
            if pace.not_before > now
        }
        limits = {
            policy_queue(p.name): 1 for p in self.policies if p.nice_ratio or p.max_rows_per_second
        }
        return Gates(resting, limits)

    def before_window(self, job: Job) -> None:
        """Check the policy's table (once per process, in a transaction of its own:
        the window's is one statement). max_rows_per_second is a promise: a
        window claimed before the rate allows it (by a second thread as the
        first one's window ended) goes back to the queue until then, no attempt
        spent, no thread held. nice_ratio's rest only holds back claims: a
        window claimed before the rest began runs."""
        self.usable(job.payload["policy"])
        pace = self._pace(self.policy(job.payload["policy"]))
        delay = pace.rate_until - time.monotonic()
        if delay > 0:
            raise Snooze(delay, f"policy at its max_rows_per_second: {delay:.3f}s to wait")

    def after_window(self, job: Job, result: WindowResult, seconds: float) -> None:
        """Adapt keys per transaction toward target_transaction; rest the policy
        (nice_ratio times the transaction's duration, and max_rows_per_second's
        share of its rows): its next window is not claimed before then. The
        rest holds no thread: the worker claims other policies' jobs meanwhile."""
        policy = self.policy(job.payload["policy"])
        WINDOW_ROWS.labels(policy.name).observe(result.rows)
        if self.observer is not None:
            self.observer(policy.name, seconds)
        pace = self._pace(policy)
        with pace.lock:
            if result.timed_out:
                pass  # halved when it timed out (_timed_out): its time says nothing more
            elif result.rows and seconds > policy.target_transaction * 1.5:
                pace.chunk = max(MIN_CHUNK, pace.chunk // 2)
            elif seconds < policy.target_transaction / 2:
                pace.chunk = min(policy.window, pace.chunk * 2)
            now = time.monotonic()
            if policy.nice_ratio and result.rows:
                # The database's CPU, I/O and locks go back to live traffic in between.
                rest = min(policy.nice_ratio * seconds, MAX_REST_SECONDS)
                pace.not_before = max(pace.not_before, now + rest)
            if policy.max_rows_per_second:
                pace.rate_until = max(pace.rate_until, now) + (
                    result.rows / policy.max_rows_per_second
                )
                pace.not_before = max(pace.not_before, pace.rate_until)
        log.info(
            "window already applied: duplicate skipped"
            if result.duplicate
            else "window booked after a timeout"
            if result.timed_out
            else "window applied",
            extra={
                "policy": policy.name,
                "run": job.payload["run_id"],
                "job": job.key,
                "attempt": job.attempt,
                "rows": result.rows,
            },
        )

    def finish_batch(self, jobs: list[Job]) -> None:
        """After a worker ran a claimed batch: finish the runs of its jobs that
        have nothing left pending. One check per run and batch, not per window;
        a run whose last job's worker died before this is left to the rescuer's
        sweep (finish_idle_runs)."""
        self.finish_runs({j.payload["run_id"] for j in jobs if j.payload.get("run_id")})

    # -- reading ------------------------------------------------------------------

    def watermark(self, name: str) -> float:
        """Seconds since the oldest expired row still present became expired (0:
        none). Raises SchemaError for a quarantined policy, quarantining one
        whose table changed since its check (last_watermark then says what was
        last read)."""
        policy, target = self.policy(name), self.target(name)
        with self._drift(name, job=False), self.engine.transaction() as conn:
            cutoff = self.engine.now(conn) - timedelta(seconds=policy.retain)
            oldest = target.oldest(conn, cutoff)
        seconds = max(0.0, (cutoff - oldest).total_seconds()) if oldest else 0.0
        with self._lock:
            self._watermarks[name] = seconds
        return seconds

    def last_watermark(self, name: str) -> float | None:
        """The policy's watermark as this process last read it (None: never)."""
        with self._lock:
            return self._watermarks.get(name)

    def preview(self, name: str, cutoff: datetime | None = None, *, limit: int = 10) -> PlanPreview:
        """Dry-run: what a run would do, by the same statements, the policy's
        check included, in a transaction the database keeps from writing."""
        policy, engine = self.policy(name), self.engine
        with engine.read_transaction() as conn:
            target = self.target(name, conn)
            if cutoff is None:
                cutoff = engine.now(conn).replace(microsecond=0) - timedelta(seconds=policy.retain)
            target.storage = storage = target.detect(conn)  # as a run would read it now
            warnings = target.read_values(conn, storage)
            candidates = target.count(conn, cutoff)
            parts = target.expired_partitions(conn, cutoff, storage)
            strategy = target.choose(conn, cutoff, storage)
            spans = self._preview_spans(target, strategy.name, conn, cutoff, storage)
        return PlanPreview(
            name,
            cutoff,
            candidates,
            len(spans),
            spans[:limit],
            target.reading,
            strategy=strategy.describe(),
            partitions=[
                {
                    "partition": f"{x.schema}.{x.name}",
                    "rows_estimated": x.rows if x.rows >= 0 else None,  # None: never analyzed
                    "action": target.partition_mode(),
                }
                for x in parts
            ],
            warnings=warnings,
        )

    def _preview_spans(
        self, target: Target, strategy: str, conn: Any, cutoff: datetime, storage: Storage
    ) -> list[Span]:
        """Every window a run would plan now (rows in whole expired partitions
        included: the preview drops nothing)."""
        spans: list[Span] = []
        page = defaults.PLAN_PAGE
        if strategy == BLOCKS:
            if target.oldest(conn, cutoff, storage) is None:
                return spans
            pages, step = target.plan_blocks(conn, cutoff, storage)
            cursor: dict[str, Any] | None = {"after": 0, "max": pages, "step": step}
            while cursor is not None:
                more, cursor = self._blocks_page(target, cursor, False)
                spans += more
            return spans
        if strategy == TIME:
            after: Position | None = None
            while uppers := target.time_page(conn, cutoff, after, page, storage):
                for upper in uppers:
                    spans.append(Span.positions(after, upper))
                    after = upper
                if len(uppers) < page:
                    break
            return spans
        bounds = target.bounds(conn, cutoff, storage)
        if bounds:
            window, lo = target.policy.window, bounds[0] - 1
            while los := target.plan_page(conn, cutoff, lo, bounds[1], page, storage):
                spans += [Span.keys(x, x + window) for x in los]
                lo = los[-1] + window
                if len(los) < page:
                    break
        return spans


def _first_plan_job(policy: Policy, rid: str, cutoff: datetime) -> NewJob:
    """A run's first planning job, keyed by the run."""
    return new_job(
        PLAN,
        {"policy": policy.name, "run_id": rid, "cutoff": format_time(cutoff)},
        key=f"{rid}:plan",
        max_attempts=policy.max_attempts,
        priority=policy.priority,
        queue=policy_queue(policy.name),
    )


def _plan_job(policy: Policy, run: dict[str, Any], cursor: dict[str, Any]) -> NewJob:
    """A run's next planning page, keyed by where it starts."""
    after = cursor["after"]
    named = position_name(tuple(after)) if isinstance(after, list) else after
    return new_job(
        PLAN,
        {**run, **cursor},
        key=f"{run['run_id']}:plan:{named}",
        max_attempts=policy.max_attempts,
        priority=policy.priority,
        queue=policy_queue(policy.name),
    )


def _window_job(policy: Policy, run: dict[str, Any], span: Span) -> NewJob:
    """A planned window, keyed policy:cutoff:<lower bound>."""
    return _span_job(policy, run, span, span.job_key)


def _span_job(
    policy: Policy,
    run: dict[str, Any],
    span: Span,
    key: Callable[[str], str],
    *,
    halvings: int = 0,
    held: str | None = None,
) -> NewJob:
    """A window job for ``span`` of the run (with the storage its planner read),
    keyed by ``key`` of the run id: a planned window, the rest of a paced one,
    or a half of one split around a referenced row; ``halvings``: the times
    its first attempt halves it (_halvings)."""
    fields = {k: run[k] for k in ("policy", "run_id", "cutoff", "storage")}
    shrunk = {"halvings": halvings} if halvings else {}
    probe = {"held": held} if held else {}
    return new_job(
        WINDOW,
        {**fields, **span.payload(), **shrunk, **probe},
        key=key(run["run_id"]),
        max_attempts=policy.max_attempts,
        priority=policy.priority,
        queue=policy_queue(policy.name),
    )


def _rest_job(
    policy: Policy, run: dict[str, Any], rest: Span, halvings: int, *, held: str | None = None
) -> NewJob:
    """The continuation of a window whose part was taken (or kept) after
    ``halvings`` timeouts: it starts one halving fewer, as the part's success
    says the rows just past it are likely good, and doubles back to full size
    one success at a time. Started at full size, each continuation of a window
    around a held row timed out again from the top: O(log² n) timeouts where
    O(log n) suffice."""
    return _span_job(policy, run, rest, rest.job_key, halvings=max(0, halvings - 1), held=held)


def _partition_job(policy: Policy, run: dict[str, Any], part: Partition, mode: str) -> NewJob:
    """A whole expired partition of the run, keyed policy:cutoff:partition:<name>."""
    fields = {k: run[k] for k in ("policy", "run_id", "cutoff", "storage")}
    return new_job(
        PARTITION,
        {**fields, "mode": mode, "partition": {"schema": part.schema, "name": part.name}},
        key=f"{run['run_id']}:partition:{part.schema}.{part.name}",
        max_attempts=policy.max_attempts,
        priority=policy.priority,
        queue=policy_queue(policy.name),
    )


def _storage(payload: dict[str, Any], target: Target) -> Storage:
    """The storage a run's planner read, carried by its jobs (jobs queued before
    runs carried it use the storage of the process's check)."""
    token = payload.get("storage")
    return Storage.from_token(token) if token else target.storage


HELD_RETRY = ": retried around the rows another transaction holds"
"""How a window's lock wait that ran out is recorded (the database's words
first): its next attempt cuts the window around the held rows (_around_held)."""


def _lock_words(job: Job) -> str:
    """The database's words for the lock wait a window met: carried by a rest
    cut around a held row, else read back from its last attempt's error."""
    carried = job.payload.get("held")
    if isinstance(carried, str) and carried:
        return carried
    error = str(job.errors[-1].get("error", "")) if job.errors else ""
    words = error.split(": ", 1)[-1].removesuffix(HELD_RETRY)
    return words if error.endswith(HELD_RETRY) and words else "lock wait timed out"


def _database_words(exc: BaseException) -> str:
    """An error's message as the database wrote it: its first line (PyMySQL's
    errors carry (errno, message) as their arguments)."""
    args = exc.args
    if len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], str):
        return args[1]
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _partition_held(job: Job, policy: Policy, name: str, exc: Exception) -> TransientError:
    """A partition's removal waited out partition_lock_timeout behind the
    application's own transactions on the table: tried again within 2, 4, 8 ...
    seconds (at most PARTITION_LOCK_RETRY_CAP_SECONDS), each try stalling the
    table's traffic for at most that timeout, and no attempt spent for
    UNSPENT_PARTITION_LOCK_SECONDS of such tries."""
    streak = 1
    for error in reversed(job.errors):
        if error.get("kind") != "lock_timeout":
            break
        streak += 1
    within = min(
        defaults.PARTITION_LOCK_RETRY_CAP_SECONDS,
        defaults.SHRINK_RETRY_SECONDS * 2.0 ** min(streak, 30),
    )
    return TransientError(
        f"partition {name}: {_database_words(exc)} (partition_lock_timeout "
        f"{format_duration(policy.partition_lock_timeout)}; the table is in use: "
        "tried again soon, no attempt spent)",
        kind="lock_timeout",
        retry_within=within,
        spend=False,
        unspent_for=defaults.UNSPENT_PARTITION_LOCK_SECONDS,
    )


def _log_blocked(job: Job, reason: str, *, split: bool, timed_out: bool) -> None:
    """One line for a window split or a row kept, by a foreign key or a timeout."""
    if timed_out:
        message = "window timed out: split" if split else "window timed out on one row: row kept"
    else:
        message = "window split around a referenced row" if split else "referenced row kept"
    log.warning(
        message,
        extra={
            "policy": job.payload["policy"],
            "run": job.payload["run_id"],
            "job": job.key,
            "attempt": job.attempt,
            "reason": reason,
        },
    )


def handlers(cleanup: Callable[[], Cleanup]) -> list[Handler]:
    """The built-in planning and window jobs, over the Cleanup that ``cleanup``
    returns (the App builds it on first use). The window job completes its own
    job in its one statement (queue/handlers.py's private modes)."""
    return [
        Handler(
            PLAN,
            lambda job, tx: cleanup().plan_page(job, tx),
            after=lambda job, windows, seconds: cleanup().after_plan(job, windows, seconds),
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
            after_batch=lambda jobs: cleanup().finish_batch(jobs),
            completes_job=True,
            statement=True,
        ),
    ]
