"""Batched acknowledgement: the completions of jobs whose handlers run outside
any transaction (``batched_ack=True``), written many to a transaction.

A job acknowledged here is complete once its batch commits: at most ``delay``
seconds after the first job of the batch finished, or as soon as ``size`` jobs
wait (a thread of its own commits them, while the job loops go on). Until
then it is still leased ("running"); should the process die first, its lease
expires and it runs again. So a batched job runs at least once, and a crash
repeats at most the jobs of two batches per worker (2 x ``size``: one
committing, one filling): the promise of pgqueuer's and Oban's
acknowledgements, and the price of one commit for many jobs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..types import Job
from .jobs import Queue

log = logging.getLogger("expiry.worker")


class AckBuffer:
    def __init__(
        self,
        queue: Queue,
        *,
        size: int,
        delay: float,
        acked: Callable[[list[Job]], None] | None = None,
    ) -> None:
        self.queue = queue
        self.size = max(1, size)
        self.delay = max(0.0, delay)
        self.acked = acked
        """Called after each commit with the jobs it completed (their log lines)."""
        self._pending: list[Job] = []
        self._since: float | None = None  # when the oldest pending job finished
        self._cond = threading.Condition()
        self._flushing = threading.Lock()  # one batch commits at a time, in order

    def add(self, job: Job) -> None:
        """A job whose handler returned: acknowledge it with the next batch. A full
        batch goes to the flusher's thread, which commits it while this one claims
        and runs the next; should twice that wait, this thread commits them itself
        (the flusher is behind: the database is slow)."""
        with self._cond:
            self._pending.append(job)
            first = self._since is None
            if first:
                self._since = time.monotonic()
            waiting = len(self._pending)
            if first or waiting >= self.size:
                # A first job starts the delay the flusher, idle until now, must
                # wait out; a full batch is due at once.
                self._cond.notify()
        if waiting >= 2 * self.size:
            self.flush()

    def flush(self) -> int:
        """Write what waits now, in one transaction; the jobs it completed."""
        with self._flushing:
            with self._cond:
                jobs, self._pending, self._since = self._pending, [], None
            if not jobs:
                return 0
            done = self._complete(jobs)
        if done and self.acked is not None:
            self.acked(done)
        return len(done)

    def _complete(self, jobs: list[Job]) -> list[Job]:
        try:
            done = self.queue.ack_many(jobs)
        except Exception as exc:  # the database went away: their leases bring them back
            log.warning(
                "could not acknowledge %d jobs; they run again once their leases expire: %s",
                len(jobs),
                exc,
            )
            return []
        acked = {job.id for job in done}
        for job in (j for j in jobs if j.id not in acked):
            log.warning(
                "lease lost before the acknowledgement; the job runs again",
                extra={"job": job.key, "attempt": job.attempt},
            )
        return done

    def run(self, stopping: threading.Event) -> None:
        """The flusher's loop: write a batch once it is full, or ``delay`` after its
        first job finished, until ``stopping`` (the worker writes what is left once
        its job loops end)."""
        while not stopping.is_set():
            with self._cond:
                due = self._due()
                if due > 0:
                    self._cond.wait(min(due, 0.5))
                    continue
            self.flush()

    def _due(self) -> float:
        """Seconds until the pending batch must be written (0: now); under the lock."""
        if self._since is None:
            return 0.5
        if len(self._pending) >= self.size:
            return 0.0
        return max(0.0, self._since + self.delay - time.monotonic())

    def wake(self) -> None:
        """Let the flusher see a change (the worker stopping) at once."""
        with self._cond:
            self._cond.notify()
