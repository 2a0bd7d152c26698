"""The durable delayed queue, as the application sees it.

A thin service over the Engine: it turns friendly arguments into NewJob rows,
computes retry delays, and audits operator actions (redrive, discard). Every
time it stores comes from the database clock: a delay is "seconds after the
database's now()", never a timestamp read from this process.
"""

from __future__ import annotations

import logging
import random
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import defaults
from ..engines.base import Engine
from ..types import RESERVED_PREFIX, AuditAction, EnqueueResult, Job, JobState, NewJob, QueueStats
from . import retry

log = logging.getLogger("expiry.queue")

RunAt = datetime | timedelta | float | int | None

CRON_QUEUE = "expiry.cron"
"""Where cron calls wait (cron/targets.py)."""


def policy_queue(policy: str) -> str:
    """Where a policy's planning, partition and window jobs wait. A queue per
    policy lets a worker hold back one rested policy's windows (not claiming
    from its queue) while it works the others, and share its threads fairly
    across policies (a claim takes the queues in turn)."""
    return f"{RESERVED_PREFIX}policy.{policy}"


def is_reserved(name: str) -> bool:
    """A queue or handler name of expiry's own (RESERVED_PREFIX)."""
    return name.startswith(RESERVED_PREFIX)


_OWN_KEY = re.compile(r"^(?:[a-z0-9][a-z0-9-]*:\d{4}-\d\d-\d\dT|cron:)")


def is_reserved_key(key: str) -> bool:
    """A job key shaped like one of expiry's own: ``policy:cutoff...`` (a run's
    planning, partition and window jobs) or ``cron:...`` (cron calls). Job keys
    are unique across queues, so a job holding such a key could take the place
    of expiry's own job: the public API never stores one (see message_key)."""
    return _OWN_KEY.match(key) is not None


def message_key(queue: str, key: str) -> str:
    """The job key of a message published over HTTP with dedupe key ``key``: the
    queue's name, "/", the key. A dedupe key is its queue's own: the same key
    in two queues is two messages (no queue name holds "/"), and a publisher
    learns nothing of another queue's keys. A job key stays unique across
    queues, so every lookup by job key (redrive, discard, the dashboard's
    /jobs/KEY) still names one job."""
    return f"{queue}/{key}"


def dedupe_key(job_key: str, queue: str) -> str:
    """A message's dedupe key as its publisher gave it (message_key undone); a
    job key made another way is its own dedupe key."""
    return job_key.removeprefix(f"{queue}/")


def new_job(
    name: str,
    payload: dict[str, Any] | None = None,
    run_at: RunAt = None,
    key: str | None = None,
    *,
    queue: str = defaults.QUEUE,
    priority: int = 0,
    max_attempts: int = defaults.MAX_ATTEMPTS,
) -> NewJob:
    """Build a job. ``run_at`` is an aware datetime, or a delay (timedelta or
    seconds) after the database's now(); None means now. Without a key, one is
    made up, and the job cannot be deduplicated."""
    when: datetime | None = None
    delay = 0.0
    if isinstance(run_at, datetime):
        when = run_at if run_at.tzinfo else run_at.replace(tzinfo=UTC)
    elif isinstance(run_at, timedelta):
        delay = run_at.total_seconds()
    elif run_at is not None:
        delay = float(run_at)
    return NewJob(
        handler=name,
        payload=dict(payload or {}),
        key=key or f"{name}:{uuid.uuid4()}",
        queue=queue,
        run_at=when,
        delay=delay,
        priority=priority,
        max_attempts=max_attempts,
    )


class Queue:
    def __init__(self, engine: Engine, *, rng: random.Random | None = None) -> None:
        self.engine = engine
        self.rng = rng or random.Random()

    def enqueue(
        self,
        name: str,
        payload: dict[str, Any] | None = None,
        run_at: RunAt = None,
        key: str | None = None,
        *,
        queue: str = defaults.QUEUE,
        priority: int = 0,
        max_attempts: int = defaults.MAX_ATTEMPTS,
        conn: Any | None = None,
    ) -> EnqueueResult:
        """Enqueue one job; ``.enqueued`` is False when its key already existed."""
        job = new_job(
            name, payload, run_at, key, queue=queue, priority=priority, max_attempts=max_attempts
        )
        return self.engine.job_insert_many([job], conn)[0]

    def enqueue_many(self, jobs: Iterable[NewJob], conn: Any | None = None) -> list[EnqueueResult]:
        """Enqueue many jobs in one statement (one round trip)."""
        return self.engine.job_insert_many(list(jobs), conn)

    def claim(
        self,
        n: int = 1,
        lease: float = defaults.LEASE_SECONDS,
        *,
        queues: Sequence[str] = (defaults.QUEUE,),
        owner: str = "anonymous",
        fair_share: bool = False,
        limits: Mapping[str, int] | None = None,
    ) -> list[Job]:
        """Lease up to ``n`` due jobs; nobody else gets them while the lease holds.
        The queues take turns (each one's first due job before any one's second);
        ``limits`` caps what one claim takes from a queue. ``fair_share``: take
        at most half of the due jobs (rounded up), so that the last jobs of a
        backlog spread over the workers that claim them."""
        return self.engine.job_claim(queues, n, lease, owner, fair_share, limits)

    def heartbeat(self, job: Job, lease: float = defaults.LEASE_SECONDS) -> bool:
        """Extend the lease; False means it was lost and the job must be dropped."""
        return self.engine.job_heartbeat(job, lease)

    def complete(self, job: Job, conn: Any | None = None) -> None:
        """Complete; inside ``conn``'s transaction when given. Raises LeaseLost."""
        self.engine.job_complete(job, conn)

    def complete_many(self, jobs: Sequence[Job], conn: Any) -> None:
        """Complete jobs that ran together in ``conn``'s transaction (group commit).
        Raises LeaseLost, completing none, when any of their leases was lost."""
        self.engine.job_complete_many(jobs, conn)

    def ack_many(self, jobs: Sequence[Job]) -> list[Job]:
        """Complete jobs that ran outside any transaction, together, in one
        transaction of their own (batched acknowledgement): the ones completed. A
        job whose lease moved on is left to its new owner, and the others complete
        all the same. A database error propagates, and completes none."""
        if not jobs:
            return []
        done = self.engine.job_ack_many(jobs)
        return [job for job in jobs if job.id in done]

    def fail(
        self, job: Job, error: str, transient: bool = True, kind: str | None = None
    ) -> JobState | None:
        """Transient: retry after backoff while attempts remain; else dead.
        Returns the new state, or None when the lease had been lost."""
        delay = retry.backoff(job.attempt, self.rng) if transient else None
        return self.engine.job_fail(
            job, error, kind or ("transient" if transient else "permanent"), delay
        )

    def release(self, job: Job, delay: float = 0.0, *, reason: str | None = None) -> bool:
        """Give a job back unrun, without spending an attempt; ``reason``: why it
        waits (a snooze), shown with how long it has waited."""
        return self.engine.job_release(job, delay, reason=reason)

    def rescue(self) -> int:
        """Make jobs whose lease expired available again (or dead if exhausted)."""
        rescued = self.engine.job_rescue()
        for row in rescued:
            log.warning(
                "lease expired; job returned to the queue",
                extra={"job": row["key"], "attempt": row["attempt"], "state": row["state"]},
            )
        return len(rescued)

    def get(self, key: str) -> Job | None:
        return self.engine.job_get(key)

    def queues_of(self, jobs: Sequence[Job]) -> dict[int, str]:
        """The queue each job (by id) waits or runs in."""
        return self.engine.job_queues([job.id for job in jobs])

    def dead(self, queue: str | None = None, limit: int = 100) -> list[Job]:
        """The dead-letter queue, newest first."""
        return self.engine.job_list(JobState.DEAD, queue, limit)

    def redrive(
        self,
        keys: Sequence[str] = (),
        *,
        all: bool = False,
        policy: str | None = None,
        actor: str = "operator",
    ) -> list[str]:
        """Send dead jobs back with a fresh attempt budget; audited. ``policy``
        without keys means every dead job of that policy."""
        all = all or (policy is not None and not keys)
        rows = self.engine.job_redrive(keys, all=all, policy=policy)
        for row in rows:
            self.engine.audit_append(
                None,
                AuditAction.JOB_REDRIVEN,
                actor=actor,
                job_key=row["key"],
                run_id=row["run_id"],
                policy=row.get("policy") or policy,
            )
        return [row["key"] for row in rows]

    def discard(self, keys: Sequence[str], *, actor: str = "operator") -> list[str]:
        """Cancel dead or waiting jobs; audited."""
        rows = self.engine.job_discard(keys)
        for row in rows:
            self.engine.audit_append(
                None,
                AuditAction.JOB_DISCARDED,
                actor=actor,
                job_key=row["key"],
                run_id=row["run_id"],
            )
        return [row["key"] for row in rows]

    def prune(self, older_than: float = defaults.PRUNE_AFTER_SECONDS, batch: int = 10_000) -> int:
        """Delete completed and cancelled jobs older than ``older_than`` seconds."""
        total = 0
        while (deleted := self.engine.job_prune(older_than, batch)) > 0:
            total += deleted
            if deleted < batch:
                break
        return total

    def pending(self, queue: str | None = None, *, due_only: bool = False) -> int:
        return self.engine.job_pending_count(queue, due_only=due_only)

    def stats(self) -> QueueStats:
        return self.engine.job_stats()
