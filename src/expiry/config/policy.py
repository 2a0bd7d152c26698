"""A retention policy ([[policy]]) and a legal hold ([[hold]]): what is
cleaned, how and when, and what no policy may take."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from .. import defaults
from ..crontab import check_expression, period
from ..times import parse_duration
from .fields import Duration, Strict, check_identifier, check_zone, one_predicate
from .sections import HealthSettings


class Hold(Strict):
    """A legal hold: rows of ``table`` that no policy may delete while it is in
    the config, named by a predicate on the table (``where``) or listed by key in
    another table (``keys_table``, ``keys_column``)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=63)
    table: str
    where: str | None = None
    keys_table: str | None = None
    keys_column: str | None = None
    key: str | None = None
    """The column of ``table`` that keys_column's values match; default: each
    policy's key."""
    reason: str = ""

    @field_validator("table", "keys_table")
    @classmethod
    def _table(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value, qualified=True)

    @field_validator("keys_column", "key")
    @classmethod
    def _column(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value)

    @field_validator("where")
    @classmethod
    def _where(cls, value: str | None) -> str | None:
        return one_predicate(value)

    @model_validator(mode="after")
    def _one_kind(self) -> Hold:
        if (self.where is None) == (self.keys_table is None):
            raise ValueError(
                'a hold names its rows one way: where = "<predicate on the table>", or '
                "keys_table and keys_column (a table listing the held keys)"
            )
        if (self.keys_table is None) != (self.keys_column is None):
            raise ValueError(
                "keys_table and keys_column go together: the table listing the held keys "
                "and its column that holds them"
            )
        if self.key is not None and self.keys_table is None:
            raise ValueError("key is the column keys_column matches: remove it, or use keys_table")
        return self


def same_table(a: str, b: str) -> bool:
    return a.lower() == b.lower()


class Policy(HealthSettings):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=63)
    table: str
    key: str
    timestamp: str
    timestamp_format: Literal["iso", "epoch", "epoch_ms", "julianday"] | None = None
    """How the timestamp column stores time when it is not a native time type;
    read from the data when absent, and checked against the data when stated."""
    timestamp_zone: str | None = None
    """The IANA zone the app writes naive times in (a PostgreSQL timestamp
    without time zone or date, a MySQL DATETIME or DATE, ISO text without a
    zone suffix); default [database] timestamp_zone, else UTC. Refused for a
    column that carries its zone or holds epoch numbers (timestamps.py)."""
    _database_zone: str | None = PrivateAttr(default=None)
    _holds: tuple[Hold, ...] = PrivateAttr(default=())
    inclusive: bool = False
    """True: a row is expired when its timestamp is at or before the cutoff
    (``<=``, as Laravel's session garbage collection deletes); default ``<``."""
    retain: Duration = 0.0
    where: str | None = None
    keep_last: int | None = Field(None, ge=1, le=10_000_000)
    """Keep the N newest rows (by timestamp, then key), of each group_by value
    or of the table: a row goes only when it is expired and beyond them, both
    read as its window runs."""
    group_by: str | None = None
    """The column whose values keep_last counts within (a user, a tenant); a
    row whose group is null is kept."""
    action: Literal["delete", "archive"] = "delete"
    archive_table: str | None = None
    window: int = Field(defaults.WINDOW, ge=1, le=10_000_000)
    windows: Literal["auto", "key", "time", "blocks"] = "auto"
    """How a run splits the expired rows: key windows (lo, hi] over an integer
    key, time windows of ``window`` rows in the timestamp's order, or block
    windows over the heap (PostgreSQL); "auto" picks by the key's type, how
    densely the expired keys fill their range and the planner's statistics."""
    partitions: Literal["auto", "drop", "detach", "rows"] = "auto"
    """On a partitioned table (PostgreSQL): partitions wholly before the cutoff
    are dropped ("drop", the default for a delete policy without where),
    detached and kept ("detach"), or cleaned row by row like the rest ("rows")."""
    schedule: str | None = None
    timezone: str = "UTC"
    catch_up: Literal["latest", "all", "none"] = "latest"
    max_catch_up: int = Field(10, ge=1, le=1000)
    max_attempts: int = Field(defaults.MAX_ATTEMPTS, ge=1, le=100)
    lock_timeout: Duration = parse_duration(defaults.LOCK_TIMEOUT)
    partition_lock_timeout: Duration = parse_duration(defaults.PARTITION_LOCK_TIMEOUT)
    """How long a partition's detach waits for the parent table's lock (the
    application's queries on the table queue behind it meanwhile), then
    retries later without spending an attempt for an hour."""
    statement_timeout: Duration = parse_duration(defaults.STATEMENT_TIMEOUT)
    target_transaction: Duration = defaults.TARGET_TRANSACTION_SECONDS
    max_rows_per_second: float | None = Field(None, gt=0)
    nice_ratio: float = Field(defaults.NICE_RATIO, ge=0, le=100)
    nice_when: Literal["busy", "always"] = defaults.NICE_WHEN
    """When nice_ratio rests: "busy", while the database shows the
    application's sessions at work (read every health_interval; always on
    SQLite, which cannot say), or "always"."""
    priority: int = Field(0, ge=-100, le=100)
    watermark_warn: Duration | None = None
    watermark_alert: Duration | None = None
    stall_after: Duration | None = None
    """A run open longer than this is stalled: red in status and the dashboard,
    expiry_run_stalled in /metrics, audited once. Default: stall_seconds."""
    approve: bool = False
    """True: each run stops after its planning checks, before any window or
    partition, and waits for someone to approve its preview (cleanup/approval.py)."""
    approve_within: Duration = parse_duration(defaults.APPROVE_WITHIN)
    """A run not approved this long after its first preview finishes without
    deleting anything (audited run.approval_expired)."""

    @property
    def stall_seconds(self) -> float:
        """stall_after, or three periods of the schedule (at least ten minutes),
        or an hour for a policy without a schedule; with ``approve``, the
        default also allows approve_within (a run waiting for its approval is
        not stalled: past approve_within it ends by itself)."""
        if self.stall_after is not None:
            return self.stall_after
        waits = self.approve_within if self.approve else 0.0
        if self.schedule is None:
            return waits + defaults.STALL_UNSCHEDULED_SECONDS
        every = period(self.schedule, self.timezone)
        return waits + max(defaults.STALL_MIN_SECONDS, defaults.STALL_PERIODS * every)

    @field_validator("table", "archive_table")
    @classmethod
    def _table(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value, qualified=True)

    @field_validator("key", "timestamp")
    @classmethod
    def _column(cls, value: str) -> str:
        return check_identifier(value)

    @field_validator("group_by")
    @classmethod
    def _group_by(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value)

    @property
    def holds(self) -> tuple[Hold, ...]:
        """The config's [[hold]] entries on this policy's table."""
        return self._holds

    @property
    def database_zone(self) -> str | None:
        """[database] timestamp_zone, which applies where timestamp_zone is absent."""
        return self._database_zone

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        return check_zone(value)

    @field_validator("timestamp_zone")
    @classmethod
    def _timestamp_zone(cls, value: str | None) -> str | None:
        return None if value is None else check_zone(value)

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        if value is not None:
            check_expression(value)
        return value

    @field_validator("lock_timeout", "partition_lock_timeout", "statement_timeout")
    @classmethod
    def _limit(cls, value: float) -> float:
        if value < 0.001:  # PostgreSQL takes whole milliseconds: less is 0
            raise ValueError(
                "0 turns the limit off in PostgreSQL (a window could wait on a lock, or "
                'run, without end): write a positive duration such as "2s" or "30s"'
            )
        return value

    @field_validator("approve_within")
    @classmethod
    def _approve_within(cls, value: float) -> float:
        if value < 1:
            raise ValueError('write how long a run waits for its approval, e.g. "24h"')
        return value

    @field_validator("stall_after")
    @classmethod
    def _stall_after(cls, value: float | None) -> float | None:
        if value is not None and value < 1:
            raise ValueError('write how long a run may stay open before it is stalled, e.g. "1h"')
        return value

    @field_validator("where")
    @classmethod
    def _where(cls, value: str | None) -> str | None:
        return one_predicate(value)

    @model_validator(mode="after")
    def _archive(self) -> Policy:
        if self.action == "archive" and not self.archive_table:
            raise ValueError('action = "archive" needs archive_table = "<table to move rows into>"')
        if self.action == "delete" and self.archive_table:
            raise ValueError('archive_table is set but action is "delete": set action = "archive"')
        if self.partitions in ("drop", "detach") and self.where:
            raise ValueError(
                f'partitions = "{self.partitions}" removes whole partitions, which would take '
                'rows that where keeps: remove where, or write partitions = "rows"'
            )
        if self.group_by is not None and self.keep_last is None:
            raise ValueError(
                "group_by says whose newest rows keep_last keeps: set keep_last = N "
                "(the rows kept per group), or remove group_by"
            )
        if self.partitions in ("drop", "detach") and self.keep_last is not None:
            raise ValueError(
                f'partitions = "{self.partitions}" removes whole partitions, which may hold '
                'rows that keep_last keeps: remove keep_last, or write partitions = "rows"'
            )
        if self.partitions in ("drop", "detach") and self.action == "archive":
            raise ValueError(
                f'partitions = "{self.partitions}" with action = "archive" would take rows '
                'without archiving them: write partitions = "rows" (or "auto")'
            )
        return self
