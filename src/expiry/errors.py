"""The errors expiry raises, as one tree.

    ExpiryError
    ├── ConfigError            bad expiry.toml or bad usage; the CLI exits 2
    │   └── CutoffRefused      a cutoff later than now - retain, without force
    ├── SchemaError            a policy does not match the live database schema
    ├── ForeignKeyBlocked      a window's delete would break a foreign key; nothing was taken
    ├── MigrationError         the database was migrated by a newer expiry, or not yet
    ├── DatabaseUnavailable    the database refused the connection (its own message)
    ├── PayloadTooLarge        a job payload over the limit
    ├── LeaseLost              the caller no longer holds the job's lease
    ├── AlreadyApplied         app.once(): the operation committed before
    ├── Snooze                 not yet: put the job back without spending an attempt
    └── JobError               raised by handlers to say how a job failed
        ├── TransientError     retry with backoff while attempts remain
        └── PermanentError     straight to the dead-letter queue

Each class's docstring is its default message. Driver errors are translated at
the engine boundary with ``raise ... from exc`` so the cause is never lost.
"""

from __future__ import annotations

from collections.abc import Callable


class ExpiryError(Exception):
    """expiry failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(ExpiryError):
    """The configuration is invalid."""


class CutoffRefused(ConfigError):
    """The cutoff is later than now - retain: rows still within retention would be deleted."""


class SchemaError(ExpiryError):
    """A policy does not match the database schema."""


class ForeignKeyBlocked(ExpiryError):
    """A row of the window is referenced under ON DELETE RESTRICT or NO ACTION.

    Raised by Engine.window_apply after undoing the window's statements, with the
    caller's transaction still usable: the window is then split until the
    referenced rows stand alone (cleanup/window.py)."""


class MigrationError(ExpiryError):
    """The database schema cannot be migrated by this version of expiry."""


class DatabaseUnavailable(ExpiryError):
    """The database cannot be reached or refused the connection."""


class PayloadTooLarge(ExpiryError):
    """The job payload is larger than the limit; carry identifiers, not records."""


class KeyConflict(ExpiryError):
    """A job's deterministic key is held by another job, not the one expected."""


class QuotaExceeded(ExpiryError):
    """A key already owns as many of something as its limit allows."""


class LeaseLost(ExpiryError):
    """The job's lease expired or was taken over by another worker."""


class JobError(ExpiryError):
    """The job failed."""


class TransientError(JobError):
    """The job failed for a reason that may pass; it will be retried."""

    def __init__(
        self,
        message: str | None = None,
        *,
        kind: str | None = None,
        retry_within: float | None = None,
        spend: bool = True,
        unspent_for: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        """The failure's kind as the job's errors record it (default: the class's name)."""
        self.retry_within = retry_within
        """Retry within this many seconds (full jitter), not after the attempt's backoff:
        the next attempt is different work (a window retried smaller)."""
        self.spend = spend
        """False: the failure spends no attempt (the next attempt is smaller work,
        and the work shrinks to an end by itself)."""
        self.unspent_for = unspent_for
        """With spend False: how long a streak of such failures spends no attempt
        (None: UNSPENT_SHRINK_SECONDS); past it, each spends one."""


class PermanentError(JobError):
    """The job failed for a reason that retrying cannot fix."""


class AlreadyApplied(ExpiryError):
    """This operation committed before; the block was skipped and the job ends as a duplicate."""


class Snooze(ExpiryError):
    """The job cannot run yet; it goes back to the queue without spending an attempt."""

    def __init__(
        self,
        delay: float,
        message: str | None = None,
        *,
        then: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(message)
        self.delay = delay
        self.then = then
        """Run once the job is back in the queue, its transaction rolled back
        (to record why it waits, in a transaction of its own); not when the
        release failed (the lease was lost: another delivery has the job)."""
