"""Request and response bodies of the HTTP API. The same models validate
requests, generate /openapi.json and fill the discovery documents, so the
three cannot drift apart."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..queue.jobs import is_reserved, is_reserved_key, message_key
from ..times import in_utc
from ..types import RESERVED_PREFIX

QUEUE_NAME = r"^[A-Za-z0-9_.:-]{1,100}$"
MAX_DEPTH = 32
"""The deepest nesting of arrays and objects a message may have."""
MAX_KEY = 500
"""The longest dedupe key, in characters. Its job key (message_key: the queue,
"/", the key) is 601 characters at most: 2,404 bytes of UTF-8, within what a
unique index holds (about 2,700 bytes on PostgreSQL) and MySQL's varchar(700)."""
MAX_JOB_KEY = 700
"""The longest job key (MySQL's varchar(700)): a message's is at most 601."""
CRON_NAME = r"^[a-z0-9][a-z0-9-]{0,62}$"
NO_NUL = r"^[^\x00]*$"
"""Free text the databases can store (PostgreSQL text refuses NUL)."""


def _storable(value: Any, depth: int = 0) -> None:
    """Refuse what parses as JSON but the databases cannot hold: NUL characters
    and lone surrogates (PostgreSQL text and jsonb refuse both; a surrogate does
    not even encode as UTF-8), NaN or Infinity (not JSON numbers), and nesting
    deeper than MAX_DEPTH (no message needs it; reading one back would fail)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("contains a NUL character (\\u0000), which cannot be stored")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                "contains a lone surrogate (\\ud800-\\udfff), not Unicode text"
            ) from None
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("NaN and Infinity are not JSON numbers")
    elif isinstance(value, dict):
        for key, item in value.items():
            _storable(key, depth + 1)
            _storable(item, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _storable(item, depth + 1)


def public_queue(value: str) -> str:
    """A queue the public API may name: not one of expiry's own."""
    if is_reserved(value):
        raise ValueError(
            f"{value!r} is one of expiry's own queues (names starting with "
            f"{RESERVED_PREFIX!r} are reserved); publish to and consume from your own"
        )
    return value


def public_key(value: str | None) -> str | None:
    if value is not None and value != value.strip():
        # MySQL and MariaDB compare "k " and "k" as one key (PAD SPACE): such a key
        # would stand for another message's.
        raise ValueError(f"{value!r} begins or ends with white space; strip it")
    return value


def storable_key(queue: str, key: str | None) -> None:
    """Refuse a queue whose messages' job keys (message_key) would be shaped
    like expiry's own: a queue named like ``policy:2026-12-01T...`` or ``cron:``."""
    if key is not None and is_reserved_key(message_key(queue, key)):
        raise ValueError(
            f"queue {queue!r} is shaped like one of expiry's own job keys (policy:cutoff... "
            "or cron:...); name the queue otherwise"
        )


DEFAULT_QUEUE = "default"
"""Where a message without ``queue`` goes, as the seed articles' clients send it:
a public queue like any other (expiry's own work lives in reserved queues)."""

QUEUE_FIELD = (
    'queue (and handler) name; without it, "default" (a worker running a handler of '
    "that name, or a consumer of POST /v1/queue/receive, takes the messages)"
)


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        _storable(value)
        return value


class Request(Body):
    """A request body: scalars must have their JSON type ("5" is not a number,
    "yes" and 1 are not booleans), as the schema says."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ErrorDetail(Body):
    code: str = Field(description="stable machine-readable code, e.g. invalid_request")
    message: str = Field(description="what was wrong and how to fix it")


class ErrorResponse(Body):
    error: ErrorDetail


class PublishRequest(Request):
    queue: str = Field(DEFAULT_QUEUE, pattern=QUEUE_NAME, description=QUEUE_FIELD)
    message: dict[str, Any] = Field(
        description="the job payload: identifiers, not records (<= 256 KiB)"
    )
    delay_seconds: float | None = Field(
        None, ge=0, le=10 * 366 * 86400, description="run after this many seconds"
    )
    run_at: datetime | None = Field(
        None, strict=False, description="run at this time (ISO-8601 with zone)"
    )
    key: str | None = Field(None, min_length=1, max_length=MAX_KEY, description="dedupe key")
    priority: int = Field(0, ge=-100, le=100, description="lower runs first")
    max_attempts: int = Field(8, ge=1, le=100)

    _queue = field_validator("queue")(public_queue)
    _key = field_validator("key")(public_key)

    @field_validator("run_at")
    @classmethod
    def _run_at(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("needs a time zone, e.g. 2026-12-01T00:00:00Z")
        return in_utc(value)

    @model_validator(mode="after")
    def _one_time(self) -> PublishRequest:
        if self.delay_seconds is not None and self.run_at is not None:
            raise ValueError("give delay_seconds or run_at, not both")
        storable_key(self.queue, self.key)
        return self


class Published(Body):
    key: str
    queue: str
    enqueued: bool = Field(
        description="false when a message with this key waits or ran in this queue already "
        "(dedupe keys are each queue's own)"
    )


class PublishBatchRequest(Request):
    queue: str = Field(DEFAULT_QUEUE, pattern=QUEUE_NAME, description=QUEUE_FIELD)
    messages: list[dict[str, Any]] = Field(
        min_length=1, max_length=1000, description="message bodies"
    )
    keys: list[Annotated[str, Field(min_length=1, max_length=MAX_KEY)]] | None = Field(
        None, description="one dedupe key per message"
    )
    delay_seconds: float | None = Field(None, ge=0, le=10 * 366 * 86400)

    _queue = field_validator("queue")(public_queue)

    @field_validator("keys")
    @classmethod
    def _own_keys(cls, value: list[str] | None) -> list[str] | None:
        for key in value or []:
            public_key(key)
        return value

    @model_validator(mode="after")
    def _keys(self) -> PublishBatchRequest:
        if self.keys is not None and len(self.keys) != len(self.messages):
            raise ValueError(f"keys has {len(self.keys)} items for {len(self.messages)} messages")
        for key in self.keys or []:
            storable_key(self.queue, key)
        return self


class PublishedBatch(Body):
    results: list[Published]
    enqueued: int
    duplicates: int


class ReceiveRequest(Request):
    queue: str = Field(
        DEFAULT_QUEUE, pattern=QUEUE_NAME, description='queue to lease from; without it, "default"'
    )
    max: int = Field(1, ge=1, le=100)
    lease_seconds: float = Field(30.0, gt=0, le=3600)

    _queue = field_validator("queue")(public_queue)


class ReceivedJob(Body):
    receipt: str = Field(description="pass to ack, nack or heartbeat while the lease holds")
    key: str
    queue: str
    message: dict[str, Any]
    attempt: int
    max_attempts: int
    lease_expires_at: datetime | None


class Received(Body):
    jobs: list[ReceivedJob]


class AckRequest(Request):
    receipt: str = Field(min_length=3, max_length=200)


class AckBatchRequest(Request):
    receipts: list[Annotated[str, Field(min_length=3, max_length=200)]] = Field(
        min_length=1, max_length=1000, description="acknowledged in one transaction"
    )


class AckedBatch(Body):
    acked: list[str] = Field(description="the receipts whose jobs are now completed")
    expired: list[str] = Field(
        description="receipts whose lease expired or moved on: not acknowledged, "
        "their jobs run again"
    )


class NackRequest(Request):
    receipt: str = Field(min_length=3, max_length=200)
    delay_seconds: float | None = Field(
        None, ge=0, le=30 * 86400, description="retry after; default backoff"
    )
    permanent: bool = Field(False, description="true: straight to the dead-letter queue")
    error: str | None = Field(None, max_length=4000)


class HeartbeatRequest(Request):
    receipt: str = Field(min_length=3, max_length=200)
    lease_seconds: float = Field(30.0, gt=0, le=3600)


class JobOutcome(Body):
    key: str
    state: str


CALL_TIMEOUT = (
    "each call's whole deadline in seconds, connect to the response's end (null: the "
    "server's [http] call_timeout, 10 s by default)"
)


class CronCreateRequest(Request):
    name: str = Field(pattern=CRON_NAME)
    http_url: str = Field(max_length=2000)
    schedule: str = Field(max_length=200, description="5-field cron or @hourly, @daily, ...")
    timezone: str = Field("UTC", max_length=100)
    timeout_seconds: float | None = Field(None, gt=0, le=600, description=CALL_TIMEOUT)


class CronUpdateRequest(Request):
    """What to change of a cron target; what is left out stays."""

    http_url: str | None = Field(None, max_length=2000)
    schedule: str | None = Field(
        None, max_length=200, description="5-field cron or @hourly, @daily, ..."
    )
    timezone: str | None = Field(None, max_length=100)
    timeout_seconds: float | None = Field(
        None, gt=0, le=600, description=CALL_TIMEOUT + "; null: back to [http] call_timeout"
    )

    @model_validator(mode="after")
    def _something(self) -> CronUpdateRequest:
        if not self.model_fields_set & {"http_url", "schedule", "timezone", "timeout_seconds"}:
            raise ValueError("give http_url, schedule, timezone or timeout_seconds: what to change")
        return self


class CronTarget(Body):
    name: str
    http_url: str
    schedule: str
    timezone: str
    paused: bool
    last_fire_at: str | None
    created_at: str
    owner: str | None = Field(description="the key that created it (null: an operator's)")
    timeout_seconds: float | None = Field(None, description=CALL_TIMEOUT)


class CronCreated(CronTarget):
    secret: str = Field(description="signs every call (Standard Webhooks); shown only now")


class CronCall(Body):
    fire_time: str
    attempt: int
    status: int | None
    duration_ms: float | None
    response: str | None
    error: str | None
    at: str


class CancelRunRequest(Request):
    run_id: str = Field(max_length=300, pattern=NO_NUL)


class ApproveRunRequest(Request):
    run_id: str = Field(max_length=300, pattern=NO_NUL)


class TriggerRequest(Request):
    policy: str = Field(max_length=63)
    cutoff: datetime | None = Field(
        None, strict=False, description="default: database now() - retain"
    )
    dry_run: bool = False
    force: bool = Field(
        False,
        description="accept a cutoff later than now - retain (deletes rows still within "
        "retention); refused with 422 cutoff_refused otherwise",
    )

    @field_validator("cutoff")
    @classmethod
    def _cutoff(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        # Run ids and job payloads carry the cutoff as ISO-8601 text, which has
        # four-digit years only.
        try:
            value = in_utc(value) if value.tzinfo else value.replace(tzinfo=UTC)
        except ValueError:
            value = None
        if value is None or not 1970 <= value.year <= 9998:
            raise ValueError("use a time between 1970 and 9998")
        return value


class Window(Body):
    """A window of a dry run: keys (lo, hi], or positions (after, upto] in the
    (timestamp, key) order for time windows; range as the ledger writes it."""

    range: str
    lo: int | None = None
    hi: int | None = None
    after: list[Any] | None = None
    upto: list[Any] | None = None


class Triggered(Body):
    policy: str
    cutoff: str
    dry_run: bool
    run_id: str | None = None
    created: bool | None = Field(None, description="false when this cutoff's run existed already")
    candidates: int | None = None
    windows: int | None = None
    first_windows: list[Window] | None = None
    strategy: str | None = Field(None, description="the windows a run would use now, and why")
    partitions: list[dict[str, Any]] | None = Field(
        None, description="whole partitions a run would drop or detach now, with row estimates"
    )
    held: dict[str, int] | None = Field(
        None, description="per legal hold on the table, the expired rows it keeps"
    )


class HoldReport(Body):
    name: str
    table: str
    rows: str = Field(description="the rows it names: its where, or the table listing their keys")
    reason: str
    kept: dict[str, int] = Field(
        description="per policy on the table, the rows older than its retain that the hold keeps"
    )


class HistoryMinute(Body):
    minute: str = Field(description="the minute, by the database's clock (ISO-8601, UTC)")
    rows: int = Field(
        description="rows the policy's windows deleted or archived in it (the ledger)"
    )
    sampled: bool = Field(description="false: no worker or scheduler sampled this minute")
    backlog: int | None = Field(None, description="its queue's jobs not yet final")
    retrying: int | None = Field(None, description="of those, waiting to retry after a failure")
    dead: int | None = Field(None, description="its dead letters")
    oldest_age_seconds: float | None = Field(
        None, description="since its oldest expired row still present expired"
    )
    held: str | None = Field(None, description="what held its throttle, when it held")


class PolicyHistory(Body):
    policy: str
    minutes: list[HistoryMinute] = Field(description="oldest first, one a minute")
    held_minutes: dict[str, int] = Field(description="minutes the throttle held it, by reason")


DLQ_QUEUE = (
    "the queue whose dead jobs the keys name, as published; without it, a key names "
    "a job key or a message's key in any queue"
)


class RedriveRequest(Request):
    keys: list[Annotated[str, Field(min_length=1, max_length=MAX_JOB_KEY)]] = Field(
        default_factory=list, max_length=10_000
    )
    queue: str | None = Field(None, pattern=QUEUE_NAME, description=DLQ_QUEUE)
    all: bool = False
    policy: str | None = Field(None, max_length=63)

    @model_validator(mode="after")
    def _something(self) -> RedriveRequest:
        if not (self.keys or self.all or self.policy):
            raise ValueError("name keys, or set all = true, or give a policy")
        return self


class DiscardRequest(Request):
    keys: list[Annotated[str, Field(min_length=1, max_length=MAX_JOB_KEY)]] = Field(
        min_length=1, max_length=10_000
    )
    queue: str | None = Field(None, pattern=QUEUE_NAME, description=DLQ_QUEUE)


class Keys(Body):
    keys: list[str]


class DeadJob(Body):
    key: str
    queue: str
    handler: str
    attempt: int
    error: str | None
    kind: str | None
    payload: dict[str, Any]
    errors: list[dict[str, Any]]


class Paused(Body):
    name: str
    paused: bool
