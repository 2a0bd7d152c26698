"""Batched acknowledgement: the completions of jobs whose handlers run outside
any transaction (``batched_ack=True``), written many to a transaction.

A job acknowledged here is complete once its batch commits: at most ``delay``
seconds after the first job of the batch finished, or as soon as ``size`` jobs
wait. Until then it is still leased ("running"); should the process die
first, its lease expires and it runs again. So a batched job runs at least
once, and a crash repeats at most one batch's jobs per worker: the promise
of pgqueuer's and Oban's acknowledgements, and the price of one commit for
many jobs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .errors import LeaseLost
from .queue import Queue
from .types import Job

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
        """A job whose handler returned: acknowledge it with the next batch. The
        caller's thread writes the batch when it is full."""
        with self._cond:
            self._pending.append(job)
            if self._since is None:
                self._since = time.monotonic()
                self._cond.notify()
            full = len(self._pending) >= self.size
        if full:
            self.flush()

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

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
            with self.queue.engine.transaction() as tx:
                self.queue.complete_many(jobs, tx)
            return jobs
        except LeaseLost:
            pass  # one lease of the batch moved on: the others alone, below
        except Exception as exc:  # the database went away: their leases bring them back
            log.warning(
                "could not acknowledge %d jobs; they run again once their leases expire: %s",
                len(jobs),
                exc,
            )
            return []
        done: list[Job] = []
        for job in jobs:
            try:
                self.queue.complete(job)
                done.append(job)
            except LeaseLost:
                log.warning(
                    "lease lost before the acknowledgement; the job runs again",
                    extra={"job": job.key, "attempt": job.attempt},
                )
            except Exception as exc:
                log.warning(
                    "could not acknowledge the job; it runs again once its lease expires: %s",
                    exc,
                    extra={"job": job.key, "attempt": job.attempt},
                )
        return done

    def run(self, stopping: threading.Event) -> None:
        """The flusher's loop: write each batch ``delay`` after its first job, until
        ``stopping`` (the worker writes what is left once its job loops end)."""
        while not stopping.is_set():
            with self._cond:
                if self._since is None:
                    self._cond.wait(0.5)
                    continue
                due = self._since + self.delay - time.monotonic()
            if due > 0:
                stopping.wait(due)
                continue
            self.flush()
