"""The seam's part for history: each policy's state once a minute (backlog,
retries, dead letters, the oldest expired row's age, the throttle's hold),
kept in expiry's own tables so that it outlives every process."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ...types import Sample
from .primitives import Primitives


class SamplesSeam(Primitives):
    """The per-minute samples of the policies' state."""

    def sample_insert(self, samples: Sequence[Sample], *, conn: Any | None = None) -> int:
        """Keep ``samples``; a policy's minute sampled before (by this process or
        another) keeps its first sample. Returns how many were new."""
        added = 0
        with self.transaction_or(conn) as c:
            for s in samples:
                params = {
                    "policy": s.policy,
                    "minute": self.time_param(s.minute),
                    "backlog": s.backlog,
                    "retrying": s.retrying,
                    "dead": s.dead,
                    "oldest_age": s.oldest_age,
                    "held": s.held,
                }
                added += int(c.execute(self.queries["sample_insert"], params).rowcount)
        return added

    def sample_list(
        self, since: datetime, *, policy: str | None = None, conn: Any | None = None
    ) -> list[Sample]:
        """The samples from ``since`` on, of one policy or all, oldest first."""
        params = {"since": self.time_param(since), "policy": policy}
        return [
            Sample(
                policy=row["policy"],
                minute=self._time(row["minute"]),
                backlog=int(row["backlog"]),
                retrying=int(row["retrying"]),
                dead=int(row["dead"]),
                oldest_age=None if row["oldest_age"] is None else float(row["oldest_age"]),
                held=row["held"],
            )
            for row in self._tx_rows(conn, "sample_list", params)
        ]

    def sample_prune(self, older_than_seconds: float, *, conn: Any | None = None) -> int:
        """Delete the samples older than ``older_than_seconds``; how many went."""
        with self.transaction_or(conn) as c:
            cur = c.execute(self.queries["sample_prune"], {"age": older_than_seconds})
            return int(cur.rowcount)
