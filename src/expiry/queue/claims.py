"""The job loops: claim a batch sized by its jobs' durations, from the queues
that are open now (the gates), run it, and wait for a hint or a poll when
nothing is due. With ``claim_ahead`` a loop claims its next batch while it
runs this one (worker.py's docstring says when)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

from ..types import Gates, Job
from . import retry
from .runner import JobRunner, job_fields

log = logging.getLogger("expiry.worker")


UNTIL_IDLE_WAIT_SECONDS = 0.05
"""An --until-idle worker's idle loops check this often whether it is done:
waiting a whole poll, they held its exit back up to a second after its last job."""

CONFLICT_WAIT_SECONDS = 0.05
"""A claim that lost a conflict to another's (a deadlock error: on a Galera
cluster, another node's claim of the same job certified first) is made again
within this, at random: no back-off, the database is well."""


@dataclass
class _Loop:
    """What one job loop carries from claim to claim."""

    failures: int = 0
    """Claims failed in a row (the back-off's exponent)."""
    per_job: float | None = None
    """Seconds a job, a moving average of this loop's (the claim's size)."""
    size: int = 1
    """The size of the last claim: a batch that came back this full had more behind it."""
    cap: int | None = None
    """The most jobs a claim may take since a Galera cluster refused a larger
    claim's write set (its job rows over wsrep_max_ws_rows). None: ``batch``."""
    empty: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Queues the last empty claim found empty: (when, the engine's hint count
    then). Until a hint arrives or a poll has passed, they are not claimed again,
    so a resting policy's next window does not cost an empty claim of every other
    queue each time (the idle loop's latency is kept: a hint, or at most one poll)."""


class Claiming(JobRunner):
    """A worker's job loops."""

    def _shared(self) -> tuple[str, ...]:
        """The queues the ``concurrency`` job loops share: all but the pools'."""
        return tuple(q for q in self.queues if q not in self.pools)

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
        loop.size = min(self._claim_size(loop.per_job), loop.cap or self.batch)
        try:
            jobs = self._claim(loop.size, queues, limits)
            loop.failures = 0
        except Exception as exc:  # the database went away: back off, reconnect
            kind = self.engine.classify(exc)[1]
            if kind == "write_set_limit":  # too many job rows for the cluster: fewer
                loop.cap = max(1, loop.size // 2)
                log.warning("claim of %d jobs refused (%s); claiming %d", loop.size, exc, loop.cap)
                return []
            if kind == "deadlock":
                # Another claim took the same jobs first: on a Galera cluster two
                # nodes' claims may pick one job (SKIP LOCKED skips only this
                # node's locks) and certification rejects the later commit.
                # Nothing is wrong: claim again soon, no back-off.
                log.info("claim conflicted with another worker's; claiming again: %s", exc)
                self.stopping.wait(self.rng.uniform(0.0, CONFLICT_WAIT_SECONDS))
                return []
            loop.failures += 1
            delay = retry.backoff(loop.failures, self.rng, base=0.2, cap=10.0)
            log.warning("claim failed, retrying in %.1fs: %s", delay, exc)
            self.stopping.wait(delay)
            return []
        if not jobs:
            locked_out = self._locked_out(queues) if self.until_idle else False
            if self.stopping.is_set():
                return []
            if hints is not None and not locked_out:
                loop.empty.update({q: (now, hints) for q in queues})
            self._wait(min(self.poll, opens_in or self.poll))
        return jobs

    def _locked_out(self, queues: tuple[str, ...]) -> bool:
        """With ``until_idle``, after a claim that found nothing: stop the worker
        when nothing is left anywhere it serves, else whether ``queues`` still
        hold jobs this claim could not take: another claim in flight holds them
        locked, or another worker runs them. It may give some back (fair share,
        a release) or finish them: claim again after the short wait, not a poll
        later. One reading a queue: read twice, a queue could look busy to the
        first test and idle to the second, and the loop then rested a poll with
        the work all done."""
        if self.acks is not None:
            self.acks.flush()  # jobs awaiting their ack are not idle yet
        busy = self._busy(self.queues)
        if busy is not None and not busy:
            self.stopping.set()
            return True
        return busy is None or not busy.isdisjoint(queues)

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
