"""The workers' roll read for liveness: which workers are alive, and which
policies have due work that no live worker serves.

Every worker process writes its roll call at each heartbeat (name, host, pid,
threads, the queues it works). A worker not seen for
``defaults.WORKER_STALE_SECONDS`` is not counted alive: it may have been
killed, be stuck or be cut off. A policy is *unserved* when its queue holds
due jobs and no live worker works that queue: nothing will clean it until one
starts, so status, the dashboard and /metrics say so rather than let the
watermark grow in silence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from . import defaults
from .queue import policy_queue
from .types import QueueStats, WorkerSeen


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
