"""Plain data: jobs, their states, and what the queue reports."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


class JobState(enum.StrEnum):
    """The job state machine (docs/state_machine.md draws it).

    scheduled ─┐
    available ─┼─ claim ─► running ─ complete ─► completed
    retryable ─┘              │ fail (transient, attempts left) ─► retryable
                              │ fail (permanent or exhausted)   ─► dead ─ redrive ─► available
                              └ lease expired ─► rescuer ─► retryable (or dead if exhausted)
    scheduled/available/retryable/dead ─ cancel/discard ─► cancelled
    """

    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    RUNNING = "running"
    RETRYABLE = "retryable"
    COMPLETED = "completed"
    DEAD = "dead"
    CANCELLED = "cancelled"


WAITING_STATES = (JobState.SCHEDULED, JobState.AVAILABLE, JobState.RETRYABLE)
FINAL_STATES = (JobState.COMPLETED, JobState.DEAD, JobState.CANCELLED)


@dataclass(frozen=True)
class Job:
    id: int
    queue: str
    handler: str
    key: str
    payload: dict[str, Any]
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime
    lease_owner: str | None = None
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    last_error: str | None = None
    last_error_kind: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    created_at: datetime | None = None
    attempted_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue. ``delay`` is seconds after the database's now()."""

    handler: str
    payload: dict[str, Any]
    key: str
    queue: str = "default"
    run_at: datetime | None = None
    delay: float = 0.0
    priority: int = 0
    max_attempts: int = 8


@dataclass(frozen=True)
class EnqueueResult:
    key: str
    enqueued: bool
    """False when a job with this key already existed: nothing was added."""


@dataclass(frozen=True)
class QueueStats:
    by_state: dict[str, dict[str, int]]
    """queue -> state -> count"""
    oldest_due_seconds: dict[str, float]
    """queue -> age of its oldest due job (0 when none is due)"""
    running: list[tuple[str, str, float]]
    """(queue, job key, seconds since claimed) for every running claim"""
    retries_by_kind: dict[str, int]
    dead: int
