"""The policies' history, kept in the database: once a minute (by the
database's clock) each policy's backlog, retries waiting, dead letters, the
age of its oldest expired row and the throttle's hold are sampled into
expiry's own table, whichever process takes the sample first (the workers'
rescuers and the scheduler all try; a minute keeps its first sample). The
dashboard and ``GET /v1/policies/{name}/history`` draw it; it outlives every
process, and a restart loses nothing of it. Samples older than [retention]
samples (a week) are pruned with the other records.

The rows deleted per minute are not sampled: the ledger has them exactly
(``engine.ledger_minutes``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..cleanup.service import Cleanup
from ..engines import Engine
from ..queue.jobs import policy_queue
from ..times import format_time
from ..types import UNFINISHED_STATES, JobState, QueueStats, Sample
from . import roll
from .database import merge_throttles

log = logging.getLogger("expiry.history")


class History:
    """Samples each policy's state once a minute, and reads the samples back."""

    def __init__(self, engine: Engine, cleanup: Cleanup, keep_seconds: float) -> None:
        self.engine, self.cleanup, self.keep_seconds = engine, cleanup, keep_seconds
        self._sampled: datetime | None = None
        self._lock = threading.Lock()

    def sample(self) -> int:
        """Sample, for the database clock's current minute, each policy that no
        process has sampled in it yet; at most once a minute in this process.
        One policy whose table cannot be read is sampled without its oldest
        row's age. Returns how many samples were kept."""
        minute = self.engine.now().replace(second=0, microsecond=0)
        with self._lock:
            if self._sampled == minute:
                return 0
            self._sampled = minute
        done = {s.policy for s in self.engine.sample_list(minute)}
        names = [p.name for p in self.cleanup.policies if p.name not in done]
        if not names:
            return 0
        stats = self.engine.job_stats()
        throttles = merge_throttles(roll.alive(self.engine.worker_list()))
        samples = [self._sample(name, minute, stats, throttles) for name in names]
        return self.engine.sample_insert(samples)

    def _sample(
        self, name: str, minute: datetime, stats: QueueStats, throttles: dict[str, Any]
    ) -> Sample:
        states = stats.by_state.get(policy_queue(name), {})
        try:
            oldest: float | None = self.cleanup.watermark(name)
        except Exception as exc:  # quarantined, or its table unreadable now
            log.debug("history: no oldest row's age for %s: %s", name, exc)
            oldest = None
        throttle = throttles.get(name) or {}
        held = None
        if throttle.get("state") not in (None, "open"):
            held = str(throttle.get("detail") or throttle.get("reason") or throttle["state"])
        return Sample(
            policy=name,
            minute=minute,
            backlog=sum(states.get(s, 0) for s in UNFINISHED_STATES),
            retrying=states.get(JobState.RETRYABLE, 0),
            dead=states.get(JobState.DEAD, 0),
            oldest_age=oldest,
            held=held,
        )

    def prune(self) -> int:
        """Delete the samples older than [retention] samples."""
        return self.engine.sample_prune(self.keep_seconds)

    def minutes(self, policy: str, count: int, now: datetime | None = None) -> PolicyMinutes:
        """The last ``count`` minutes of one policy up to ``now`` (the database's
        clock): its samples and the ledger's rows per minute, a slot a minute,
        oldest first (None where no sample was taken)."""
        now = now or self.engine.now()
        last = now.replace(second=0, microsecond=0)
        first = last - timedelta(minutes=count - 1)
        samples = {s.minute: s for s in self.engine.sample_list(first, policy=policy)}
        ledger = {m.minute: m.rows for m in self.engine.ledger_minutes(first) if m.policy == policy}
        slots = [first + timedelta(minutes=i) for i in range(count)]
        return PolicyMinutes(
            policy=policy,
            minutes=slots,
            samples=[samples.get(m) for m in slots],
            rows=[ledger.get(m, 0) for m in slots],
        )


@dataclass(frozen=True)
class PolicyMinutes:
    """One policy's last minutes, a slot each: what the charts draw."""

    policy: str
    minutes: list[datetime]
    samples: Sequence[Sample | None]
    rows: list[int]

    @property
    def sampled(self) -> int:
        return sum(1 for s in self.samples if s is not None)

    def series(self, field: str) -> list[float | None]:
        """One sampled field (backlog, retrying, dead, oldest_age) a minute."""
        return [None if s is None else getattr(s, field) for s in self.samples]

    def report(self) -> dict[str, Any]:
        """As ``GET /v1/policies/{name}/history`` and ``expiry history --json``
        give it: a minute an entry, oldest first."""
        return {
            "policy": self.policy,
            "minutes": [
                {
                    "minute": format_time(minute),
                    "rows": rows,
                    "sampled": s is not None,
                    "backlog": None if s is None else s.backlog,
                    "retrying": None if s is None else s.retrying,
                    "dead": None if s is None else s.dead,
                    "oldest_age_seconds": None if s is None else s.oldest_age,
                    "held": None if s is None else s.held,
                }
                for minute, rows, s in zip(self.minutes, self.rows, self.samples, strict=True)
            ],
            "held_minutes": self.held_minutes,
        }

    @property
    def held_minutes(self) -> dict[str, int]:
        """The minutes the throttle held the policy, by what held it."""
        out: dict[str, int] = {}
        for s in self.samples:
            if s is not None and s.held:
                reason = s.held.split(" ", 1)[0]
                out[reason] = out.get(reason, 0) + 1
        return out
