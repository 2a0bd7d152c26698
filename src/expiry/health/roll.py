"""The workers' roll read for liveness: which workers are alive, and which
policies have due work that no live worker serves.

Every worker process writes its roll call at each heartbeat (name, host, pid,
threads, the queues it works). A worker not seen for
``defaults.WORKER_STALE_SECONDS`` is not counted alive: it may have been
killed, be stuck or be cut off. A policy is *unserved* when its queue holds
due jobs and no live worker works that queue: nothing will clean it until one
starts, so status, the dashboard and /metrics say so rather than let the
watermark grow in silence.

The schedules are read the same way: a scheduled policy whose fire was due
more than ``defaults.SCHEDULE_LATE_SECONDS`` ago and that no scheduler took is
*unscheduled*: no scheduler keeps it (none runs, or none has this policy in
its config), and no run will open until one does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from .. import defaults
from ..crontab import Rule, next_fire
from ..queue.jobs import policy_queue
from ..types import QueueStats, Schedule, WorkerSeen


class Scheduled(Rule, Protocol):
    """A policy as the schedule reading reads it (config.Policy is one)."""

    @property
    def name(self) -> str: ...


def alive(
    workers: Iterable[WorkerSeen], stale_after: float = defaults.WORKER_STALE_SECONDS
) -> list[WorkerSeen]:
    """The workers seen on the roll within ``stale_after`` seconds."""
    return [w for w in workers if w.seen_seconds_ago <= stale_after]


def unserved(
    policies: Sequence[str], live: Sequence[WorkerSeen], stats: QueueStats
) -> dict[str, float]:
    """Each policy whose queue has due jobs that no live worker works, with
    the age of its oldest due job in seconds. Policies served, or with nothing
    due, are left out."""
    worked = {q for w in live for q in w.queues}
    out: dict[str, float] = {}
    for name in policies:
        queue = policy_queue(name)
        if queue in stats.oldest_due_seconds and queue not in worked:
            out[name] = stats.oldest_due_seconds[queue]
    return out


def unscheduled(
    policies: Sequence[Scheduled],
    schedules: Mapping[str, Schedule],
    now: datetime,
    grace: float = defaults.SCHEDULE_LATE_SECONDS,
) -> dict[str, float | None]:
    """Each scheduled policy that no scheduler keeps: the seconds since its
    first fire that none took, when that is more than ``grace``; None when no
    scheduler has ever registered its schedule. Paused schedules, and those
    on time, are left out."""
    out: dict[str, float | None] = {}
    for policy in policies:
        if policy.schedule is None:
            continue
        state = schedules.get(policy.name)
        if state is None:
            out[policy.name] = None
            continue
        if state.paused or state.last_fire_at is None:
            continue
        late = (now - next_fire(policy, state.last_fire_at)).total_seconds()
        if late > grace:
            out[policy.name] = late
    return out
