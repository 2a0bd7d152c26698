"""What one API key's publishes may leave waiting: queues, jobs and bytes.

A key's tenancy is its scopes: its quotas count the application queues its
``queue:publish`` patterns match (two keys that publish to one queue share
that queue's count). An ``admin`` key is the operator's and has none. The
counts are read from the database (``job_pending_by_queue``) at most once
per ``refresh`` seconds, and what this server enqueued since is added to
them, so that a burst within that second cannot run far past a limit. A
publish past a limit is refused whole, with 429 ``quota_exceeded`` naming the
limit and the fix: the limits are on what waits, and they free up as the
queues drain.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..keys import Principal
from ..queue.jobs import Queue
from .errors import ApiError

RETRY_AFTER = "5"
"""Seconds a refused publisher waits before it tries again (Retry-After)."""


class Quotas:
    def __init__(
        self,
        queue: Queue,
        *,
        max_queues: int,
        max_pending: int,
        max_bytes: int,
        refresh: float = 1.0,
    ) -> None:
        self.queue = queue
        self.max_queues = max_queues
        self.max_pending = max_pending
        self.max_bytes = max_bytes
        self.refresh = refresh
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, int]] = {}
        self._read_at = float("-inf")

    def admit(self, key: Principal, queue: str, messages: Sequence[dict[str, Any]]) -> None:
        """Book ``messages`` to ``queue`` for ``key``, or raise 429
        quota_exceeded (nothing booked) when they would pass a limit."""
        if key.admin:
            return
        jobs = len(messages)
        size = sum(len(json.dumps(m, separators=(",", ":")).encode()) for m in messages)
        with self._lock:
            if time.monotonic() - self._read_at >= self.refresh:
                self._counts = self.queue.engine.job_pending_by_queue()
                self._read_at = time.monotonic()
            mine = {q: c for q, c in self._counts.items() if key.can_queue("publish", q)}
            if queue not in mine and len(mine) >= self.max_queues:
                raise refused(
                    f"key {key.name!r} publishes to {len(mine)} queues that hold jobs, as many "
                    f"as [http] max_queues_per_key = {self.max_queues} allows: publish to one "
                    "of them, or wait for one to drain (or an operator raises the limit)"
                )
            pending = sum(n for n, _ in mine.values()) + jobs
            if pending > self.max_pending:
                raise refused(
                    f"key {key.name!r}'s queues would hold {pending} jobs, past [http] "
                    f"max_pending_per_key = {self.max_pending}: wait for them to drain, or "
                    "publish fewer (or an operator raises the limit)"
                )
            held = sum(b for _, b in mine.values()) + size
            if held > self.max_bytes:
                raise refused(
                    f"key {key.name!r}'s queues would hold {held} bytes of messages, past "
                    f"[http] max_pending_bytes_per_key = {self.max_bytes}: wait for them to "
                    "drain, or publish smaller messages (or an operator raises the limit)"
                )
            n, b = self._counts.get(queue, (0, 0))
            self._counts[queue] = (n + jobs, b + size)


def refused(message: str) -> ApiError:
    return ApiError(429, "quota_exceeded", message, {"Retry-After": RETRY_AFTER})
