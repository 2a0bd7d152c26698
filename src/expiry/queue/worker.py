"""The worker: claim, run each job in one transaction with its completion, and
account for every outcome.

Threads: ``concurrency`` job loops, the loops of the queues with threads of
their own (``pools``: cron calls), one heartbeat loop that extends the leases
of every job this process holds, and one rescuer that returns other workers'
expired claims to the queue (on its own connection on PostgreSQL). On SIGTERM or
SIGINT the loops finish the job in hand and give back claimed jobs they had
not started, without spending their attempts; a second signal, or a stop that
outlasts the grace period, exits at once (signals.py).

With ``claim_ahead=True``, a loop whose claim came back full of short jobs
claims the next batch while it runs this one (on a thread of its own, where
the engine has concurrent writers): the claim's round trip and the server's work on it overlap the
batch's transactions instead of following them. Those jobs are leased (and
heartbeated) meanwhile; a claim ahead whose queue has since come to rest goes
back, as does one still in hand at shutdown. Never for a paced queue (a claim
limit): each of its windows waits for the rest after the one before.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Histogram

from .. import defaults, signals
from ..engines import Engine
from ..engines.common import OUTAGE_KINDS
from ..errors import AlreadyApplied, LeaseLost, Snooze, TransientError
from ..types import AuditAction, Gates, Job, JobState
from . import retry
from .acks import AckBuffer
from .handlers import Handler
from .jobs import Queue, policy_queue

log = logging.getLogger("expiry.worker")

JOB_SECONDS = Histogram(
    "expiry_job_duration_seconds",
    "Time a job's transaction took, by handler and outcome",
    ["handler", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

HELPER_JOIN_SECONDS = 10.0
UNTIL_IDLE_WAIT_SECONDS = 0.05
"""An --until-idle worker's idle loops check this often whether it is done:
waiting a whole poll, they held its exit back up to a second after its last job."""
ROLL_CALL_SECONDS = 5.0
"""With a health monitor, the roll call also tells the throttles this often."""


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


@dataclass
class _Loop:
    """What one job loop carries from claim to claim."""

    failures: int = 0
    """Claims failed in a row (the back-off's exponent)."""
    per_job: float | None = None
    """Seconds a job, a moving average of this loop's (the claim's size)."""
    size: int = 1
    """The size of the last claim: a batch that came back this full had more behind it."""
    empty: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Queues the last empty claim found empty: (when, the engine's hint count
    then). Until a hint arrives or a poll has passed, they are not claimed again,
    so a resting policy's next window does not cost an empty claim of every other
    queue each time (the idle loop's latency is kept: a hint, or at most one poll)."""


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
    """Claim the next batch while running a full one (the module says when)."""
    outage_budget: float = defaults.OUTAGE_BUDGET_SECONDS
    """A database outage's failures spend no attempt for this long."""


class Worker:
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
        settings = settings or WorkerSettings()
        self.settings = settings
        self.engine = engine
        self.queue = queue
        self.handlers = handlers
        self.hooks = hooks or Hooks()
        self.concurrency = max(1, settings.concurrency)
        self.queues = tuple(dict.fromkeys(settings.queues))  # a queue named twice is read once
        self.pools = {q: max(1, n) for q, n in settings.pools.items() if q in self.queues}
        """Queues with threads of their own (cron calls): the ``concurrency`` job
        loops never claim from them, so a slow call never holds a thread that cleans."""
        self.batch = max(1, settings.batch)
        self.claim_hold = settings.claim_hold
        self.lease = settings.lease
        self.poll = settings.poll
        self.until_idle = settings.until_idle
        self.claim_ahead = settings.claim_ahead and engine.concurrent_writers
        """Claim the next batch while running a full one (the module says when).
        Off unless asked: on a 2-core machine it paid only for one process of
        group-committed jobs (1.15x; 0.97x-1.00x elsewhere, docs/performance.md).
        Off, a job loop has no second thread."""
        self.outage_budget = settings.outage_budget
        """A database outage's failures spend no attempt for this long (engine
        OUTAGE_KINDS: connection lost, shutdown, read-only, disk full): a
        database that is down is not the job's fault."""
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

    # -- lifecycle -------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or idle with ``until_idle``). Returns an exit code.
        SIGTERM and SIGINT stop it (signals.py: from the main thread, or in a
        process that listens already); the handlers are put back on return, so
        that a worker run inside a larger program (or a test) leaves Ctrl-C
        working as before."""
        with signals.listening(stop=self.stop):
            return self._run_loops()

    def _run_loops(self) -> int:
        log.info("worker started", extra={"worker": self.name})
        # Listen before the first claim: a hint sent between an empty claim and
        # the first wait (the planner's first page, at start-up) is not lost.
        self.engine.listen()
        helpers = [
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self._rescue_loop, name="rescuer", daemon=True),
        ]
        if self.acks is not None:
            helpers.append(
                threading.Thread(
                    target=self.acks.run, args=(self.stopping,), name="acks", daemon=True
                )
            )
        if self.hooks.monitor is not None:
            # A first reading before the first claim: a held policy is held from
            # the start, and a canary's baseline is taken while nothing runs.
            delay = self._monitor()
            helpers.append(
                threading.Thread(
                    target=self._monitor_loop, args=(delay,), name="health", daemon=True
                )
            )
        loops = [
            threading.Thread(target=self._job_loop, args=(None,), name=f"job-{i}", daemon=True)
            for i in range(self.concurrency if self._shared() else 0)
        ]
        loops += [
            threading.Thread(target=self._job_loop, args=((q,),), name=f"{q}-{i}", daemon=True)
            for q, n in self.pools.items()
            for i in range(n)
        ]
        self._roll_call()
        for thread in helpers + loops:
            thread.start()
        for thread in loops:
            while thread.is_alive():
                thread.join(0.2)
        if self.acks is not None:  # the loops are done: what they ran, acknowledged now
            self.acks.flush()
        self.stopping.set()
        if self.acks is not None:
            self.acks.wake()
        # Let a heartbeat or rescue in flight finish before the caller closes the
        # engine: a helper still inside the driver as its connection closes (or
        # as the interpreter exits) can take the process down.
        for thread in helpers:
            thread.join(HELPER_JOIN_SECONDS)
        try:
            self.engine.worker_gone(self.name)
        except Exception as exc:  # the roll forgets it within a day anyway
            log.warning("could not leave the workers' roll: %s", exc)
        log.info("worker stopped", extra={"worker": self.name})
        return self._idle_exit_code()

    def _idle_exit_code(self) -> int:
        """0, or 1 for an --until-idle worker that found nothing to do while a
        run stays open past its bound: idle is not done then, and the caller
        (a cron job, a CI step) must hear of it."""
        if not self.until_idle or self.hooks.stalled is None:
            return 0
        try:
            mine = set(self.queues)
            stalled = {p: age for p, age in self.hooks.stalled().items() if policy_queue(p) in mine}
        except Exception as exc:
            log.warning("could not read the open runs: %s", exc)
            return 0
        for policy, age in sorted(stalled.items()):
            log.error(
                "idle, but a run of this policy has been open for %.0fs: stalled",
                age,
                extra={"policy": policy},
            )
        return 1 if stalled else 0

    def set_queues(self, queues: tuple[str, ...]) -> None:
        """Work ``queues`` from now on (a config reload added or dropped a
        policy): the job loops read them at their next claim."""
        self.queues = tuple(dict.fromkeys(queues))

    def _shared(self) -> tuple[str, ...]:
        """The queues the ``concurrency`` job loops share: all but the pools'."""
        return tuple(q for q in self.queues if q not in self.pools)

    def stop(self) -> None:
        """Finish the jobs in hand and give back the claimed jobs not started."""
        self.stopping.set()

    # -- loops ------------------------------------------------------------------

    def _claim_size(self, per_job: float | None) -> int:
        """As many jobs as this loop expects to finish in about ``claim_hold``
        seconds, at most ``batch``: short jobs come many to a claim, while slow
        ones (cleanup windows) are not held back from idle workers, and a crash
        charges an attempt to few jobs that only waited their turn. One until the
        first batch is timed. The claim itself then takes at most half of the due
        jobs (fair share), so that a backlog's last jobs spread over the workers
        and a run ends when its last window does, not one batch later. Always
        ``batch``, and no fair share, when ``claim_hold`` is None."""
        if self.claim_hold is None:
            return self.batch
        if per_job is None:
            return 1
        return max(1, min(self.batch, int(self.claim_hold / max(per_job, 1e-6))))

    def _gates(self, mine: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, int], float | None]:
        """The queues of ``mine`` this loop may claim from now, the per-queue
        limits, and the seconds until the first resting queue opens (None: none
        rests). A rest holds back its queue, never this thread."""
        try:
            gates = self.hooks.gates() if self.hooks.gates is not None else Gates()
        except Exception as exc:  # pacing must not stop the loop
            log.warning("could not read the pacing gates: %s", exc)
            gates = Gates()
        now = time.monotonic()
        resting = [t - now for q, t in gates.resting.items() if t > now and q in mine]
        open_queues = tuple(q for q in mine if gates.resting.get(q, 0.0) <= now)
        return open_queues, gates.limits, min(resting, default=None)

    def _job_loop(self, mine: tuple[str, ...] | None) -> None:
        """A job loop over ``mine``, or (None) over the shared queues as they
        are at each claim."""
        if not self.claim_ahead:
            self._loop(mine, None)
            return
        with ThreadPoolExecutor(1, thread_name_prefix=threading.current_thread().name) as ahead:
            self._loop(mine, ahead)

    def _loop(self, mine: tuple[str, ...] | None, ahead: ThreadPoolExecutor | None) -> None:
        loop = _Loop()
        next_batch: Future[list[Job]] | None = None  # claimed ahead, while the last ran
        try:
            while not self.stopping.is_set():
                queues, limits, opens_in = self._gates(self._shared() if mine is None else mine)
                jobs = self._arrived(next_batch, queues) if next_batch is not None else []
                next_batch = None
                if not jobs:
                    jobs = self._claim_due(loop, queues, limits, opens_in)
                    if not jobs:
                        continue
                if ahead is not None and self._ahead_pays(jobs, loop.size, limits):
                    next_batch = ahead.submit(self._claim_ahead, loop.size, queues, limits)
                for job in jobs:  # a queue that gave a job may give more
                    loop.empty.pop(job.queue, None)
                started = time.monotonic()
                ran = self._run_batch(jobs)
                if ran:
                    sample = (time.monotonic() - started) / len(ran)
                    loop.per_job = (
                        sample if loop.per_job is None else 0.7 * loop.per_job + 0.3 * sample
                    )
        finally:
            if next_batch is not None:  # stopping: what was claimed ahead goes back
                self._give_back(next_batch.result())

    def _claim_due(
        self, loop: _Loop, queues: tuple[str, ...], limits: dict[str, int], opens_in: float | None
    ) -> list[Job]:
        """A claim of the queues not found empty since the last hint; none (after
        a wait or a back-off) when there is nothing to claim or it failed. With
        ``until_idle``, the worker stops once everything is done."""
        if not queues:  # every queue rests: wait for the first to open
            self.stopping.wait(opens_in or self.poll)
            return []
        hints, now = self.engine.hints_seen(), time.monotonic()
        quiet = self._quiet(loop.empty, queues, hints, now)
        if len(quiet) == len(queues):  # nothing new where this loop may claim
            self._wait(min([*quiet.values(), opens_in or self.poll]))
            return []
        queues = tuple(q for q in queues if q not in quiet)
        loop.size = self._claim_size(loop.per_job)
        try:
            jobs = self._claim(loop.size, queues, limits)
            loop.failures = 0
        except Exception as exc:  # the database went away: back off, reconnect
            loop.failures += 1
            delay = retry.backoff(loop.failures, self.rng, base=0.2, cap=10.0)
            log.warning("claim failed, retrying in %.1fs: %s", delay, exc)
            self.stopping.wait(delay)
            return []
        if not jobs:
            locked_out = False
            if self.until_idle:
                if self.acks is not None:
                    self.acks.flush()  # jobs awaiting their ack are not idle yet
                busy = self._busy(self.queues)
                if busy is not None and not busy:
                    self.stopping.set()
                    return []
                # Jobs of this loop's queues that this claim could not take: another
                # claim in flight holds them locked, or another worker runs them. It
                # may give some back (fair share, a release) or finish them: claim
                # again after the short wait, not a poll later. One reading a queue:
                # read twice, a queue could look busy to the first test and idle to
                # the second, and the loop then rested a poll with the work all done.
                locked_out = busy is None or not busy.isdisjoint(queues)
            if hints is not None and not locked_out:
                loop.empty.update({q: (now, hints) for q in queues})
            self._wait(min(self.poll, opens_in or self.poll))
        return jobs

    def _claim(self, size: int, queues: tuple[str, ...], limits: dict[str, int]) -> list[Job]:
        return self.queue.claim(
            size,
            self.lease,
            queues=queues,
            owner=self.name,
            fair_share=self.claim_hold is not None,
            limits=limits,
        )

    def _ahead_pays(self, jobs: list[Job], size: int, limits: dict[str, int]) -> bool:
        """Whether to claim the next batch while ``jobs`` run: the claim came back
        full (more are due), of more than one job (short ones: slow jobs come
        one to a claim), from queues no pacing limits."""
        return (
            self.claim_ahead
            and size > 1
            and len(jobs) >= size
            and not any(job.queue in limits for job in jobs)
        )

    def _claim_ahead(self, size: int, queues: tuple[str, ...], limits: dict[str, int]) -> list[Job]:
        """The next batch, claimed on this loop's second thread and held (its
        leases heartbeated) until the loop takes it; a failed claim is the loop's
        next claim to retry."""
        try:
            jobs = self._claim(size, queues, limits)
        except Exception as exc:
            log.warning("claim ahead failed: %s", exc)
            return []
        with self._lock:
            self._held.update({job.id: job for job in jobs})
        return jobs

    def _arrived(self, claimed: Future[list[Job]], queues: tuple[str, ...]) -> list[Job]:
        """The batch claimed ahead, less the jobs of queues that have come to rest
        since (a throttle's hold, a policy's pause): those go back unrun."""
        jobs = claimed.result()
        resting = [job for job in jobs if job.queue not in queues]
        if resting:
            self._give_back(resting, why="its queue rests")
        return [job for job in jobs if job.queue in queues]

    def _wait(self, seconds: float) -> None:
        """Wait for a hint of new work, at most ``seconds``; with ``until_idle``
        at most UNTIL_IDLE_WAIT_SECONDS, so that the loops idle while another
        still works see, soon after, that it found everything done (a hint
        cannot wake them: the last job sends none)."""
        if self.until_idle:
            seconds = min(seconds, UNTIL_IDLE_WAIT_SECONDS)
        self.engine.wait_for_jobs(seconds)

    def _run_batch(self, jobs: list[Job]) -> list[Job]:
        """Run a claimed batch, group by group; on shutdown, give back the rest.
        A batch where one job's transaction can pass on to the next (_chains)
        runs on one connection (pinned); any other holds a connection only while
        it uses one (a cron call's HTTP request holds none). The jobs that ran."""
        with self._lock:
            self._held.update({job.id: job for job in jobs})
        ran: list[Job] = []
        groups = self._groups(jobs)
        chains = [
            len(group) == 1 and self._chains(group[0], after)
            for group, after in zip(groups, [*groups[1:], None], strict=True)
        ]
        with self.engine.pinned() if any(chains) else nullcontext():
            for group, chain in zip(groups, chains, strict=True):
                if self.stopping.is_set():
                    self._give_back(jobs[len(ran) :])
                    break
                if len(group) > 1:
                    self._process_group(group)
                else:
                    self._process(group[0], chain=chain)
                ran.extend(group)
        self._after_batch(ran)
        return ran

    def _chains(self, job: Job, after: list[Job] | None) -> bool:
        """Whether ``job``'s COMMIT should open the transaction of the job run
        after it (engine.transaction(chain=True)): both run alone, in a
        transaction the worker completes, with no hook between the two."""
        if after is None or len(after) > 1:
            return False
        first, second = self.handlers.get(job.handler), self.handlers.get(after[0].handler)
        return (
            first is not None
            and second is not None
            and first.chains
            and second.chains
            and first.after is None
            and second.before is None
        )

    def _quiet(
        self,
        empty: dict[str, tuple[float, int]],
        queues: tuple[str, ...],
        hints: int | None,
        now: float,
    ) -> dict[str, float]:
        """The queues of ``queues`` that a claim found empty less than a poll ago,
        with no hint since: each with the seconds until its poll is due."""
        return {
            q: when + self.poll - now
            for q, (when, seen) in empty.items()
            if q in queues and seen == hints and when + self.poll > now
        }

    def _groups(self, jobs: list[Job]) -> list[list[Job]]:
        """The claimed jobs in claim order, neighbours whose handlers allow group
        commit put together, every other job alone."""
        groups: list[list[Job]] = []
        previous_grouped = False
        for job in jobs:
            handler = self.handlers.get(job.handler)
            grouped = handler is not None and handler.group_commit
            if grouped and previous_grouped:
                groups[-1].append(job)
            else:
                groups.append([job])
            previous_grouped = grouped
        return groups

    def _busy(self, queues: tuple[str, ...]) -> set[str] | None:
        """The queues of ``queues`` with a job running or due, each read once;
        None when a count could not be read (not idle)."""
        try:
            return {q for q in queues if self.queue.pending(q, due_only=True)}
        except Exception:
            return None

    def _give_back(self, jobs: list[Job], why: str = "on shutdown") -> None:
        for job in jobs:
            try:
                self.queue.release(job)
                log.info("job released %s", why, extra=job_fields(job))
            except Exception as exc:
                log.warning(
                    "could not release job; its lease will expire: %s", exc, extra=job_fields(job)
                )
            with self._lock:
                self._held.pop(job.id, None)

    def _monitor(self) -> float:
        assert self.hooks.monitor is not None
        try:
            return max(0.05, self.hooks.monitor())
        except Exception as exc:  # the health must not stop the worker
            log.warning("health check failed: %s", exc)
            return self.poll

    def _monitor_loop(self, delay: float) -> None:
        told = time.monotonic()
        while not self.stopping.wait(delay):
            delay = self._monitor()
            if time.monotonic() - told > ROLL_CALL_SECONDS:  # the throttles, fresh enough
                told = time.monotonic()
                self._roll_call()

    def _roll_call(self) -> None:
        """Say on the workers' roll who this worker is, what it works, how many
        jobs it holds and which of its queues rest (the dashboard's workers page)."""
        now = time.monotonic()
        try:
            gates = self.hooks.gates() if self.hooks.gates is not None else Gates()
            with self._lock:
                holding = len(self._held)
            self.engine.worker_seen(
                self.name,
                host=socket.gethostname(),
                pid=os.getpid(),
                threads=self.concurrency + sum(self.pools.values()),
                queues=self.queues,
                resting={q: t - now for q, t in gates.resting.items() if t > now},
                holding=holding,
                health=self.hooks.report() if self.hooks.report is not None else None,
            )
        except Exception as exc:
            log.warning("roll call failed: %s", exc, extra={"worker": self.name})

    def _heartbeat_loop(self) -> None:
        while not self.stopping.wait(self.lease / 3):
            self._roll_call()
            with self._lock:
                held = list(self._held.values())
            for job in held:
                try:
                    if not self.queue.heartbeat(job, self.lease):
                        with self._lock:
                            still_held = job.id in self._held
                        if still_held:  # not merely finished since the snapshot above
                            log.warning("lease lost while running", extra=job_fields(job))
                except Exception as exc:
                    log.warning("heartbeat failed: %s", exc, extra=job_fields(job))

    def _rescue_loop(self) -> None:
        last_prune = 0.0
        while not self.stopping.wait(self.rescue_every * self.rng.uniform(0.5, 1.0)):
            try:
                self.queue.rescue()
                if self.hooks.sweep is not None:
                    self.hooks.sweep()
                if time.monotonic() - last_prune > 300:
                    last_prune = time.monotonic()
                    self.queue.prune(self.prune_after)
                    if self.hooks.prune is not None:
                        self.hooks.prune()
            except Exception as exc:
                log.warning("rescuer failed: %s", exc)

    # -- one job -------------------------------------------------------------

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
            self.queue.release(job, snooze.delay, reason=str(snooze))
            log.info("job snoozed: %s", snooze, extra={**fields, "delay": snooze.delay})
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
        the time it names (a partition waiting for its table's lock)."""
        if kind in OUTAGE_KINDS:
            return self.outage_budget
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
