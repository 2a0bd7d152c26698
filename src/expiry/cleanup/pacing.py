"""Pacing: how fast a policy's windows go, per process. Keys per transaction
(halved after a timeout, grown back one success at a time), the rest after
a window (nice_ratio, max_rows_per_second) and the throttle's gates."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Histogram

from ..config import Config, Policy
from ..engines import Engine
from ..errors import Snooze
from ..queue.jobs import policy_queue
from ..types import Gates, Job
from .jobs import WindowResult
from .policies import Policies
from .runs import Runs

log = logging.getLogger("expiry.cleanup")


WINDOW_ROWS = Histogram(
    "expiry_window_rows",
    "Rows deleted or archived per window transaction",
    ["policy"],
    buckets=(0, 1, 10, 100, 1000, 5000, 10000, 50000, 100000),
)


MIN_CHUNK = 100


MAX_REST_SECONDS = 2.0  # a nice_ratio rest never outlasts this


@dataclass
class Pace:
    """Per policy, per process: keys per transaction, and when its next window
    may start (the rest after the last one: monotonic seconds)."""

    chunk: int
    ceiling: int | None = None
    """The most keys (or rows) a transaction may take here until the config is
    reloaded: a Galera cluster refused more (its wsrep_max_ws_rows or
    wsrep_max_ws_size). None: the window."""
    not_before: float = 0.0
    """No window is claimed before this: the rest after the last one."""
    rate_until: float = 0.0
    """No window starts before this (max_rows_per_second's share of the rows
    already taken): a window claimed earlier goes back to the queue until then."""
    lock: threading.Lock = field(default_factory=threading.Lock)


class Pacing(Policies):
    """The pace of each policy's windows in this process."""

    def __init__(self, engine: Engine, config: Config, runs: Runs | None = None) -> None:
        super().__init__(engine, config, runs)
        self._paces: dict[str, Pace] = {}
        self.quiet: Callable[[], bool] | None = None
        """Whether the database showed none of the application's sessions at
        work lately (the health monitor's reading): nice_ratio "busy" rests
        only when it did. None: always rest."""

    def forget_targets(self) -> None:
        """After a config reload: each policy's pace starts again too."""
        super().forget_targets()
        with self._lock:
            self._paces.clear()

    def _pace(self, policy: Policy) -> Pace:
        with self._lock:
            return self._paces.setdefault(policy.name, Pace(chunk=policy.window))

    def _rests(self, policy: Policy) -> bool:
        """Whether nice_ratio rests after this window: always, or ("busy")
        unless the database showed none of the application's sessions at work."""
        return policy.nice_when == "always" or self.quiet is None or not self.quiet()

    def gates(self) -> Gates:
        """What the worker holds back now: each policy's queue while the policy
        rests (the worker claims from the others meanwhile), and a paced
        policy's queue to one job a claim (nice_ratio's only while it rests:
        _rests)."""
        now = time.monotonic()
        with self._lock:
            paces = dict(self._paces)
        resting = {
            policy_queue(name): pace.not_before
            for name, pace in paces.items()
            if pace.not_before > now
        }
        # A paced policy's windows are claimed one a claim, each after the rest
        # of the one before; one that takes no rest now is claimed in batches.
        limits = {
            policy_queue(p.name): 1
            for p in self.policies
            if p.max_rows_per_second or (p.nice_ratio and self._rests(p))
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
                pace.chunk = min(max(MIN_CHUNK, pace.chunk // 2), pace.ceiling or policy.window)
            elif seconds < policy.target_transaction / 2:
                pace.chunk = min(policy.window, pace.ceiling or policy.window, pace.chunk * 2)
            now = time.monotonic()
            if policy.nice_ratio and result.rows and self._rests(policy):
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
