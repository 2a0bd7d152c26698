"""Running one job, or a group of them, and accounting for its outcome: the
handler in one transaction with its completion, then the retry, the dead
letter, the lease lost or the duplicate. The base of the Worker (worker.py),
which holds its state and settings."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Histogram

from .. import defaults
from ..engines import Engine
from ..engines.common import OUTAGE_KINDS
from ..errors import AlreadyApplied, LeaseLost, Snooze, TransientError
from ..types import AuditAction, Gates, Job, JobState
from . import retry
from .acks import AckBuffer
from .handlers import Handler
from .jobs import Queue

log = logging.getLogger("expiry.worker")


JOB_SECONDS = Histogram(
    "expiry_job_duration_seconds",
    "Time a job's transaction took, by handler and outcome",
    ["handler", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


def job_fields(job: Job) -> dict[str, Any]:
    """The fields every job log line carries."""
    return {
        "policy": job.payload.get("policy"),
        "run": job.payload.get("run_id"),
        "job": job.key,
        "attempt": job.attempt,
    }


@dataclass(frozen=True)
class Hooks:
    """What the worker calls back into, besides the handlers: the cleanup's run
    bookkeeping (App.hooks wires them)."""

    sweep: Callable[[], Any] | None = None
    """Run by the rescuer after returning expired claims: finish runs left open
    by a worker that died after its run's last commit."""
    prune: Callable[[], Any] | None = None
    """Run by the rescuer beside the queue's own pruning (every 5 minutes):
    expiry's retention of its other records ([retention] ledger)."""
    dead: Callable[[Job], None] | None = None
    """Called when a job ends dead: it may have been its run's last pending job."""
    gates: Callable[[], Gates] | None = None
    """Read before each claim: the queues to leave alone for now (a resting
    policy's), and how many jobs a claim may take from each."""
    monitor: Callable[[], float] | None = None
    """Read the database's health for the throttles (health.Health.check), on a
    thread of its own; returns the seconds until the next reading."""
    report: Callable[[], dict[str, Any]] | None = None
    """The policies' throttles as the roll call tells them."""
    stalled: Callable[[], dict[str, float]] | None = None
    """The policies with a stalled run (and its age): an --until-idle worker
    that finds nothing to do while one is stalled exits 1, not 0."""


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker claims and runs its jobs: one object, so that the App, the
    CLI and a test hand a worker its tuning the same way (App.worker builds it
    from keywords)."""

    concurrency: int = 1
    """Job loops: threads that claim and run jobs."""
    queues: tuple[str, ...] = (defaults.QUEUE,)
    """The queues it works."""
    batch: int = defaults.CLAIM_BATCH
    """The most jobs one claim takes."""
    claim_hold: float | None = defaults.CLAIM_HOLD_SECONDS
    """About how many seconds of work a claim takes (by its recent jobs'
    durations), and fair share; None: always ``batch``, no fair share."""
    lease: float = defaults.LEASE_SECONDS
    poll: float = defaults.POLL_SECONDS
    until_idle: bool = False
    """Stop once nothing is due or running (the demo, the tests, a cron job)."""
    rescue_every: float = defaults.RESCUE_SECONDS
    prune_after: float = defaults.PRUNE_AFTER_SECONDS
    pools: Mapping[str, int] = field(default_factory=dict)
    """Queues with threads of their own (cron calls): the job loops never
    claim from them, so a slow call never holds a thread that cleans."""
    ack_delay: float = defaults.ACK_DELAY_SECONDS
    claim_ahead: bool = False
    """Claim the next batch while running a full one (worker.py says when), where
    the engine has concurrent writers. Off unless asked: on a 2-core machine it
    paid only for one process of group-committed jobs (1.15x; 0.97x-1.00x
    elsewhere, docs/performance.md). Off, a job loop has no second thread."""
    outage_budget: float = defaults.OUTAGE_BUDGET_SECONDS
    """A database outage's failures (engine OUTAGE_KINDS: connection lost,
    shutdown, read-only, disk full) spend no attempt for this long: a database
    that is down is not the job's fault."""


class JobRunner:
    """A worker's state and how it runs the jobs it claimed."""

    def __init__(
        self,
        engine: Engine,
        queue: Queue,
        handlers: Mapping[str, Handler],
        hooks: Hooks | None = None,
        settings: WorkerSettings | None = None,
        *,
        name: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings = settings or WorkerSettings()
        self.engine = engine
        self.queue = queue
        self.handlers = handlers
        self.hooks = hooks or Hooks()
        self.concurrency = max(1, settings.concurrency)
        self.queues = tuple(dict.fromkeys(settings.queues))  # a queue named twice is read once
        self.pools = {q: max(1, n) for q, n in settings.pools.items() if q in self.queues}
        self.batch = max(1, settings.batch)
        self.claim_hold = settings.claim_hold
        self.lease = settings.lease
        self.poll = settings.poll
        self.until_idle = settings.until_idle
        self.claim_ahead = settings.claim_ahead and engine.concurrent_writers
        self.outage_budget = settings.outage_budget
        self.rescue_every = settings.rescue_every
        self.prune_after = settings.prune_after
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{random.randrange(16**4):04x}"
        self.rng = rng or random.Random()
        self.stopping = threading.Event()
        self.processed = 0
        self._held: dict[int, Job] = {}
        self._lock = threading.Lock()
        self.acks: AckBuffer | None = None
        """The batched acknowledgements of batched_ack handlers (None: none here)."""
        if any(h.batched_ack for h in handlers.values()):
            self.acks = AckBuffer(
                queue, size=self.batch, delay=settings.ack_delay, acked=self._acked
            )

    def process(self, job: Job) -> None:
        """Run one claimed job to one of its outcomes, as a batch of one."""
        self._process(job)
        self._after_batch([job])

    def _after_batch(self, jobs: list[Job]) -> None:
        """Each handler's ``after_batch`` hook, once, with its jobs of the batch."""
        mine: dict[str, list[Job]] = {}
        for job in jobs:
            mine.setdefault(job.handler, []).append(job)
        for name, handled in mine.items():
            handler = self.handlers.get(name)
            if handler is not None and handler.after_batch is not None:
                try:
                    handler.after_batch(handled)
                except Exception:
                    log.exception("batch hook failed", extra={"handler": name})

    def _settle(self, jobs: list[Job]) -> None:
        """Stop heartbeating jobs about to complete: a heartbeat that meets one just
        completed must not report its lease lost (completion checks the lease)."""
        with self._lock:
            for job in jobs:
                self._held.pop(job.id, None)

    def _process_group(self, jobs: list[Job]) -> None:
        """Run jobs in one transaction that completes them all (group commit): one
        commit instead of one a job. Should any of them fail, snooze or find its
        work already done, the transaction rolls back and each job runs alone, so
        that one job's outcome never decides another's."""
        handlers = [self.handlers[job.handler] for job in jobs]
        try:
            for job, handler in zip(jobs, handlers, strict=True):
                if handler.before is not None:
                    handler.before(job)
            started = time.monotonic()
            with self.engine.transaction() as tx:
                results = [h.fn(job, tx) for job, h in zip(jobs, handlers, strict=True)]
                self._settle(jobs)
                self.queue.complete_many(jobs, tx)
            elapsed = time.monotonic() - started
        except Exception as exc:
            log.info(
                "group of %d jobs rolled back (%s: %s); running them one by one",
                len(jobs),
                type(exc).__name__,
                str(exc).splitlines()[0][:200] if str(exc) else "",
                extra={"worker": self.name},
            )
            with self._lock:  # held again (and heartbeated) while they run alone
                self._held.update({job.id: job for job in jobs})
            for job in jobs:
                self._process(job)
            return
        with self._lock:
            for job in jobs:
                self._held.pop(job.id, None)
            self.processed += len(jobs)
        for job, handler, result in zip(jobs, handlers, results, strict=True):
            JOB_SECONDS.labels(job.handler, "completed").observe(elapsed)
            log.info("job completed", extra={**job_fields(job), "state": "completed"})
            if handler.after is not None:
                try:
                    handler.after(job, result, elapsed)
                except Exception:
                    log.exception("job loop error after running the job", extra=job_fields(job))

    def _process(self, job: Job, chain: bool = False) -> None:
        """Run one claimed job to one of its outcomes, then forget it."""
        try:
            self._run(job, chain)
        except Exception:
            # An after-commit hook, or the database failing while recording the
            # outcome: this loop must outlive it (an unsettled job's lease expires).
            log.exception("job loop error after running the job", extra=job_fields(job))
        finally:
            with self._lock:  # job loops run concurrently: count under the lock
                self._held.pop(job.id, None)
                self.processed += 1

    def _run(self, job: Job, chain: bool = False) -> None:
        fields = job_fields(job)
        handler = self.handlers.get(job.handler)
        if handler is None:
            self._fail(
                job,
                KeyError(
                    f"no handler {job.handler!r} is registered in this "
                    "worker (start it with --app MODULE:APP)"
                ),
                transient=False,
            )
            return
        log.debug("job running", extra=fields)
        try:
            if handler.before is not None:
                handler.before(job)
            started = time.monotonic()
            result = self._execute(job, handler, chain)
            elapsed = time.monotonic() - started
        except AlreadyApplied:
            self._complete_duplicate(job)
            return
        except Snooze as snooze:
            released = self.queue.release(job, snooze.delay, reason=str(snooze))
            log.info("job snoozed: %s", snooze, extra={**fields, "delay": snooze.delay})
            if released and snooze.then is not None:  # not when its lease was lost
                snooze.then()
            return
        except LeaseLost:
            log.warning(
                "lease lost; the work was rolled back and belongs to its new owner", extra=fields
            )
            self._audit_lease_lost(job)
            return
        except Exception as exc:
            self._fail(job, exc)
            return
        JOB_SECONDS.labels(job.handler, "completed").observe(elapsed)
        if not handler.batched_ack:  # else logged once its batch commits (_acked)
            log.info("job completed", extra={**fields, "state": "completed"})
        if handler.after is not None:
            handler.after(job, result, elapsed)

    def _execute(self, job: Job, handler: Handler, chain: bool = False) -> Any:
        """Run the handler and complete its job: in the job's transaction, or, for
        a handler without one, in a transaction of its own right after. ``chain``:
        the job's COMMIT opens the next job's transaction (_chains)."""
        if not handler.transactional:
            result = handler.fn(job)
            self._settle([job])
            if handler.batched_ack and self.acks is not None:
                self.acks.add(job)
            else:
                self.queue.complete(job)
            return result
        # The engine completes the job as the transaction's last statement, sent
        # with its COMMIT where it can (one round trip on PostgreSQL).
        with self.engine.transaction(
            pipelined=handler.pipelined,
            statement=handler.statement,
            completing=None if handler.completes_job else job,
            chain=chain,
        ) as tx:
            result = handler.fn(job, tx)
            # Settled before commit: a heartbeat that meets the completion's
            # row lock returns after it and finds the job no longer held.
            self._settle([job])
        return result

    def _acked(self, jobs: list[Job]) -> None:
        """The jobs a batched acknowledgement completed: their log lines."""
        for job in jobs:
            log.info("job completed", extra={**job_fields(job), "state": "completed"})

    def _audit_lease_lost(self, job: Job) -> None:
        """Record a delivery that lost its lease, outside its rolled-back transaction,
        so that every duplicate delivery is on the record."""
        try:
            self.engine.audit_append(
                None,
                AuditAction.JOB_LEASE_LOST,
                actor=self.name,
                policy=job.payload.get("policy"),
                run_id=job.payload.get("run_id"),
                job_key=job.key,
                detail={"attempt": job.attempt},
            )
        except Exception as exc:
            log.warning("could not audit the lost lease: %s", exc, extra=job_fields(job))

    def _complete_duplicate(self, job: Job) -> None:
        try:
            self.queue.complete(job)
            log.info(
                "job completed as a duplicate: already applied",
                extra={**job_fields(job), "state": "completed"},
            )
        except LeaseLost:
            log.warning("lease lost", extra=job_fields(job))
            self._audit_lease_lost(job)

    def _retry_delay(self, job: Job, kind: str, exc: BaseException) -> float:
        """The backoff before a retry. An outage's failures spend no attempt, so
        their backoff counts the outage's failures in a row instead, and is
        capped at OUTAGE_RETRY_CAP_SECONDS: the job resumes soon after the
        database does. A failure that says when to retry (TransientError's
        retry_within: a window retried smaller) is retried within that."""
        within = getattr(exc, "retry_within", None)
        if isinstance(exc, TransientError) and within is not None:
            return self.rng.uniform(0.0, within)
        if kind not in OUTAGE_KINDS:
            return retry.backoff(job.attempt, self.rng)
        streak = 1
        for failure in reversed(job.errors):
            if failure.get("kind") not in OUTAGE_KINDS:
                break
            streak += 1
        return retry.backoff(streak, self.rng, cap=defaults.OUTAGE_RETRY_CAP_SECONDS)

    def _unspent_within(self, kind: str, exc: BaseException) -> float | None:
        """How long a streak of failures like this one spends no attempt (None:
        it spends one): a database outage for the outage budget; a failure
        that says so (TransientError(spend=False): a window retried smaller,
        which ends by itself in about log2(window) attempts) for a day, or for
        the time it names (a partition waiting for its table's lock); a write set
        a Galera cluster refused (at its COMMIT too) for UNSPENT_WRITE_SET_SECONDS:
        a window or planning page, retried halved, fits in a few tries
        (cleanup/window.py, planner.py); a job that cannot shrink spends its
        attempts after that."""
        if kind in OUTAGE_KINDS:
            return self.outage_budget
        if kind == "write_set_limit":
            return defaults.UNSPENT_WRITE_SET_SECONDS
        if isinstance(exc, TransientError) and not exc.spend:
            if exc.unspent_for is not None:
                return exc.unspent_for
            return defaults.UNSPENT_SHRINK_SECONDS
        return None

    def _fail(self, job: Job, exc: BaseException, transient: bool | None = None) -> None:
        classified, kind = self.engine.classify(exc)
        transient = classified if transient is None else transient
        error = f"{type(exc).__name__}: {exc}".strip()
        delay = self._retry_delay(job, kind, exc) if transient else None
        try:
            state = self.engine.job_fail(
                job, error, kind, delay, unspent_within=self._unspent_within(kind, exc)
            )
        except Exception as db_exc:
            log.error(
                "could not record failure; the lease will expire and the job retry: %s",
                db_exc,
                extra=job_fields(job),
            )
            return
        handler = self.handlers.get(job.handler)
        if handler is not None and handler.failed is not None:
            try:
                handler.failed(job, kind)
            except Exception:
                log.exception("job loop error in the failure hook", extra=job_fields(job))
        fields = {
            **job_fields(job),
            "state": state.value if state else "lease_lost",
            "error": error.splitlines()[0][:300],
        }
        if state is JobState.RETRYABLE and kind in OUTAGE_KINDS:
            log.warning(
                "job failed: the database is out (%s); retrying, no attempt spent within "
                "the outage budget",
                kind,
                extra={**fields, "delay": round(delay or 0, 3)},
            )
        elif state is JobState.RETRYABLE:
            log.warning("job failed; retrying", extra={**fields, "delay": round(delay or 0, 3)})
        elif state is JobState.DEAD:
            log.error("job dead-lettered", extra=fields)
            # It may have been its run's last pending job, and no after-commit
            # hook runs for a dead job: finish the run now, not at some later sweep.
            if self.hooks.dead is not None:
                self.hooks.dead(job)
        else:
            log.warning("job failed after its lease was lost", extra=fields)
