"""Load and validate expiry.toml. A bad config is refused before anything runs,
with the policy, the field, what was wrong and how to fix it.

Path: --config, else EXPIRY_CONFIG, else ./expiry.toml. EXPIRY_DATABASE_URL
overrides [database] url.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from . import defaults
from .crontab import check_expression, period
from .engines.kinds import SUPPORTED, kind_of
from .errors import ConfigError
from .times import parse_duration

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Duration = Annotated[float, BeforeValidator(parse_duration)]


def check_identifier(value: str, *, qualified: bool = False) -> str:
    parts = value.split(".")
    if (
        (qualified and len(parts) > 2)
        or (not qualified and len(parts) > 1)
        or not all(IDENTIFIER.match(p) for p in parts)
    ):
        shape = "name or schema.name" if qualified else "column name"
        raise ValueError(
            f"{value!r} is not a plain {shape}: use letters, digits and underscores, "
            "starting with a letter or underscore"
        )
    return value


def check_zone(value: str) -> str:
    """An IANA time zone name, as zoneinfo knows it."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f'{value!r} is not an IANA time zone, e.g. "UTC" or "Europe/Paris"'
        ) from None
    return value


def check_listen(value: str) -> str:
    """HOST:PORT with both parts: ":8080" would bind every interface."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f'{value!r}: write HOST:PORT, e.g. "127.0.0.1:8080" (or "0.0.0.0:8080" to '
            "listen on every interface)"
        )
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseConfig(Strict):
    url: str
    pooler: Literal["none", "session", "transaction"] = "none"
    """What stands between expiry and PostgreSQL: "transaction" for pgbouncer
    (or a managed pooler) in transaction mode, where each transaction may get
    another server connection: no prepared statements, no session settings
    (a window's limits are set for its transaction), workers poll instead of
    LISTEN. "session" and "none" change nothing."""
    timestamp_zone: str | None = None
    """The IANA zone whose wall-clock times the policies' naive timestamp
    columns hold, for each policy that does not state its own (columns that
    carry their zone, and epoch numbers, ignore it)."""

    @field_validator("timestamp_zone")
    @classmethod
    def _timestamp_zone(cls, value: str | None) -> str | None:
        return None if value is None else check_zone(value)

    @model_validator(mode="after")
    def _pooler_on_postgres(self) -> DatabaseConfig:
        kind = kind_of(self.url)
        if kind is not None and self.pooler not in kind.poolers:
            raise ValueError(
                'pooler = "transaction" is for PostgreSQL behind pgbouncer or the like: '
                "remove it for this database"
            )
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if kind_of(value) is None:
            raise ValueError(SUPPORTED)
        return value


ALLOWED_HOST = re.compile(
    r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+|[0-9A-Fa-f:]+)(?::(?:\*|[0-9]{1,5}))?$"
)


class HttpConfig(Strict):
    listen: str = "127.0.0.1:8080"
    allowed_hosts: list[str] = []
    """Non-global targets cron calls may reach: "host:port", "host:*" (every
    port) or "host" (ports 80 and 443); IPv6 in brackets."""
    rate_limit_per_second: float = Field(50.0, gt=0)
    rate_limit_burst: int = Field(100, ge=1)
    anonymous_rate_limit_per_second: float = Field(5.0, gt=0)
    """Requests without a valid key, per client address (each gets its 401 or
    429 before its body is read)."""
    anonymous_rate_limit_burst: int = Field(20, ge=1)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    """The largest request body under /v1 (413 past it)."""
    form_body_bytes: int = Field(16 * 1024, ge=1024)
    """The largest dashboard form body (413 past it, read before any sign-in or
    CSRF check, so it is all an anonymous caller can make the server parse)."""
    header_timeout: Duration = 10.0
    """A connection's request head must be in this long after it connected (or
    after its previous response), else the connection is closed."""
    body_timeout: Duration = 30.0
    """A request's body must be in this long after its head (408 past it)."""
    trusted_proxies: list[str] = []
    """Addresses or networks ("10.0.0.0/8") whose X-Forwarded-For and
    X-Forwarded-Proto are believed; none by default, so the client address that
    per-address limits count is the connection's own."""
    call_timeout: Duration = defaults.CALL_TIMEOUT_SECONDS
    max_cron_targets_per_key: int = Field(defaults.MAX_CRON_TARGETS_PER_KEY, ge=1)
    """The most cron targets one API key may own (403 quota_exceeded past it);
    targets an operator makes with the CLI belong to no key and do not count."""
    max_queues_per_key: int = Field(defaults.MAX_QUEUES_PER_KEY, ge=1)
    """The most application queues holding jobs that a key's queue:publish scopes
    reach; a publish to one more is 429 quota_exceeded. Keys that share a queue
    share its count; admin keys have no quotas."""
    max_pending_per_key: int = Field(defaults.MAX_PENDING_PER_KEY, ge=1)
    """The most jobs not yet final in those queues (429 quota_exceeded past it)."""
    max_pending_bytes_per_key: int = Field(defaults.MAX_PENDING_BYTES_PER_KEY, ge=1024)
    """The most bytes of messages not yet final in those queues (429 past it)."""
    metrics_key: bool = False
    """True: GET /metrics needs a key with the read scope, like the API."""
    metrics_cache: Duration = 5.0
    """/metrics reads the database's aggregates at most this often."""
    metrics_queues: list[str] = []
    """Application queues /metrics names in its labels; any other reads "other"
    (expiry's own queues and "default" are always named)."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return check_listen(value)

    @field_validator("trusted_proxies")
    @classmethod
    def _trusted_proxies(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"{entry!r}: write an address (10.0.0.7) or a network (10.0.0.0/8) of "
                    "the proxies in front of expiry serve"
                ) from None
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _allowed_hosts(cls, value: list[str]) -> list[str]:
        for entry in value:
            port = entry.rsplit(":", 1)[1] if entry.count(":") == 1 or "]:" in entry else ""
            if not ALLOWED_HOST.match(entry) or (port.isdigit() and not 0 < int(port) < 65536):
                raise ValueError(
                    f"{entry!r}: write host:port (127.0.0.1:8080), host:* for every "
                    "port, or host alone for ports 80 and 443; IPv6 as [::1]:8080"
                )
        return value


class HealthSettings(Strict):
    """When to hold a policy's windows, read from the database's health every
    ``health_interval`` (health/database.py; the controller is health/throttle.py)."""

    max_replica_lag: Duration | None = None
    """Hold while a replica replays more than this behind (pg_stat_replication
    on the primary, or each [[replica]] url)."""
    critical_replica_lag: Duration | None = None
    """Stop the policy (until `expiry resume`) past this lag."""
    max_active_backends: int | None = Field(None, ge=1)
    """Hold while more client backends than this are active (pg_stat_activity)."""
    critical_active_backends: int | None = Field(None, ge=1)
    throttle_query: str | None = None
    """SQL whose first column is true to hold (trusted config, as where)."""
    pause_file: str | None = None
    """Hold while this file exists."""
    canary: str | None = None
    """A cheap statement of the application's (select 1 from sessions where id = 1),
    timed each check against its own baseline taken while the policy is idle."""
    max_latency_ratio: float | None = Field(None, gt=1)
    """Hold while the canary's tail (its ``latency_quantile``) over the last 10
    checks is more than this many times the same tail while the policy was idle."""
    critical_latency_ratio: float | None = Field(None, gt=1)
    latency_quantile: float = Field(0.9, ge=0.5, lt=1)
    """The tail of the canary's runs the ratio compares: 0.9 guards the
    application's p90; 0.99 its p99 (over 50 runs, the slowest: one slow run a
    second holds), which on a busy database can leave the cleanup crawling."""
    max_dead_tuple_ratio: float | None = Field(None, gt=0, le=1)
    """Hold while the table's dead tuples exceed this share of its rows."""
    vacuum_after: bool = False
    """VACUUM (ANALYZE) the table once a run finishes (PostgreSQL)."""
    health_interval: Duration = defaults.HEALTH_INTERVAL_SECONDS

    @field_validator("throttle_query", "canary")
    @classmethod
    def _statement(cls, value: str | None) -> str | None:
        if value is not None and (";" in value or "--" in value or "/*" in value):
            raise ValueError("must be one SQL statement without ';' or comments")
        return value

    @field_validator("health_interval")
    @classmethod
    def _interval(cls, value: float) -> float:
        if value < 0.05:
            raise ValueError('read the health at most 20 times a second: write "50ms" or more')
        return value

    @model_validator(mode="after")
    def _pairs(self) -> HealthSettings:
        if self.max_latency_ratio is not None and self.canary is None:
            raise ValueError(
                'max_latency_ratio needs canary = "<a cheap statement of the application\'s>"'
            )
        for name in ("replica_lag", "active_backends", "latency_ratio"):
            limit, stop = getattr(self, f"max_{name}"), getattr(self, f"critical_{name}")
            if limit is not None and stop is not None and stop < limit:
                raise ValueError(f"critical_{name} must not be below max_{name}")
        return self


HEALTH_FIELDS = tuple(HealthSettings.model_fields)
"""The throttle's knobs: set in [worker] for every policy, or per policy."""


class ReplicaConfig(Strict):
    url: str
    """A standby whose replay lag max_replica_lag also reads (postgresql://...,
    or a MySQL/MariaDB replica: mysql://...)."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        kind = kind_of(value)
        if kind is None or not kind.replica:
            raise ValueError(
                "a replica is a PostgreSQL standby (postgresql://host/db)"
                " or a MySQL replica (mysql://user@host/db)"
            )
        return value


class WorkerConfig(HealthSettings):
    concurrency: int = Field(2, ge=1, le=256)
    cron_threads: int = Field(defaults.CRON_THREADS, ge=1, le=64)
    """Threads of their own for cron calls: a slow target never holds a thread
    that cleans."""
    lease: Duration = defaults.LEASE_SECONDS
    claim_batch: int = Field(defaults.CLAIM_BATCH, ge=1, le=1000)
    prune_after: Duration = defaults.PRUNE_AFTER_SECONDS
    ack_delay: Duration = defaults.ACK_DELAY_SECONDS
    """How long a batched acknowledgement (``batched_ack=True`` handlers) may wait
    for more jobs before it commits."""
    outage_budget: Duration = defaults.OUTAGE_BUDGET_SECONDS
    """How long a database outage may fail a job without spending its attempts."""


class RetentionConfig(Strict):
    """expiry's own retention: how long it keeps its records."""

    ledger: Duration = Field(defaults.LEDGER_RETENTION_SECONDS, ge=86400)
    """The ledger rows of a run finished longer ago than this are deleted, then
    the run itself (the evidence `expiry evidence` reads); an open run's never.
    At least a day."""


def _one_predicate(value: str | None) -> str | None:
    if value is not None and (";" in value or "--" in value or "/*" in value):
        raise ValueError("must be one SQL predicate without ';' or comments")
    return value


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
        return _one_predicate(value)

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


def _same_table(a: str, b: str) -> bool:
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

    @property
    def stall_seconds(self) -> float:
        """stall_after, or three periods of the schedule (at least ten minutes),
        or an hour for a policy without a schedule."""
        if self.stall_after is not None:
            return self.stall_after
        if self.schedule is None:
            return defaults.STALL_UNSCHEDULED_SECONDS
        every = period(self.schedule, self.timezone)
        return max(defaults.STALL_MIN_SECONDS, defaults.STALL_PERIODS * every)

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

    @field_validator("stall_after")
    @classmethod
    def _stall_after(cls, value: float | None) -> float | None:
        if value is not None and value < 1:
            raise ValueError('write how long a run may stay open before it is stalled, e.g. "1h"')
        return value

    @field_validator("where")
    @classmethod
    def _where(cls, value: str | None) -> str | None:
        return _one_predicate(value)

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


class Config(Strict):
    database: DatabaseConfig
    http: HttpConfig = HttpConfig()
    worker: WorkerConfig = WorkerConfig()
    retention: RetentionConfig = RetentionConfig()
    replica: list[ReplicaConfig] = []
    policy: list[Policy] = []
    hold: list[Hold] = []

    @model_validator(mode="after")
    def _health_defaults(self) -> Config:
        """Each policy's health knobs it does not set come from [worker]."""
        given = self.worker.model_fields_set & set(HEALTH_FIELDS)
        if given:
            policies = []
            for policy in self.policy:
                inherited = {f: getattr(self.worker, f) for f in given - policy.model_fields_set}
                policies.append(policy.model_copy(update=inherited) if inherited else policy)
            object.__setattr__(self, "policy", policies)
        kind = kind_of(self.database.url)
        signals = kind is None or kind.health_signals
        for policy in self.policy:
            for name in ("max_replica_lag", "max_active_backends", "max_dead_tuple_ratio"):
                if not signals and getattr(policy, name) is not None:
                    raise ValueError(
                        f"policy {policy.name!r}: field {name!r}: SQLite has no such signal "
                        "(it has no replicas, backends or vacuum): remove it"
                    )
        if kind is not None and not kind.replica and self.replica:
            raise ValueError("[[replica]] is for PostgreSQL standbys; this database is SQLite")
        return self

    @model_validator(mode="after")
    def _timestamp_zones(self) -> Config:
        """Each policy knows [database] timestamp_zone, kept apart from its own
        timestamp_zone: a stated zone on a column that carries its zone is
        refused, the database's default is not applied there (cleanup/target.py)."""
        for policy in self.policy:
            policy._database_zone = self.database.timestamp_zone
        return self

    @model_validator(mode="after")
    def _holds(self) -> Config:
        """Each policy knows the holds on its table. A hold whose table is written
        otherwise than a policy's same-named table (another schema, or the same
        one qualified) is refused: it could leave that policy's rows unheld."""
        seen: set[str] = set()
        for hold in self.hold:
            if hold.name in seen:
                raise ValueError(
                    f"hold {hold.name!r}: field 'name' is used by two holds: rename one"
                )
            seen.add(hold.name)
        for policy in self.policy:
            for hold in self.hold:
                same_name = hold.table.split(".")[-1].lower() == policy.table.split(".")[-1].lower()
                if same_name and not _same_table(hold.table, policy.table):
                    raise ValueError(
                        f"hold {hold.name!r}: table {hold.table!r} and policy {policy.name!r}'s "
                        f"table {policy.table!r} may be one table: write it the same way in both"
                    )
            policy._holds = tuple(h for h in self.hold if _same_table(h.table, policy.table))
        return self

    @model_validator(mode="after")
    def _unique(self) -> Config:
        seen: set[str] = set()
        for policy in self.policy:
            if policy.name in seen:
                raise ValueError(
                    f"policy {policy.name!r}: field 'name' is used by two policies: "
                    "rename one (names must be unique)"
                )
            seen.add(policy.name)
        return self

    def get_policy(self, name: str) -> Policy:
        for policy in self.policy:
            if policy.name == name:
                return policy
        known = [p.name for p in self.policy]
        hint = difflib.get_close_matches(name, known, n=1)
        suggestion = (
            f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(known) or 'none'}"
        )
        raise ConfigError(f"no policy named {name!r}{suggestion}")


_SECTIONS: dict[str, type[BaseModel]] = {
    "database": DatabaseConfig,
    "http": HttpConfig,
    "worker": WorkerConfig,
    "replica": ReplicaConfig,
    "policy": Policy,
    "hold": Hold,
}


def _located(loc: list[Any], data: dict[str, Any]) -> tuple[str, str, list[Any]]:
    """Where an error is, in the user's words (``policy 'sessions'``,
    ``[worker]``), its section, and the rest of its location."""
    section = str(loc[0]) if loc else ""
    if section == "policy" and len(loc) >= 2 and isinstance(loc[1], int):
        index = loc[1]
        policies = data.get("policy") or []
        name = (
            policies[index].get("name")
            if index < len(policies) and isinstance(policies[index], dict)
            else None
        )
        return (f"policy {name!r}" if name else f"policy #{index + 1}"), section, loc[2:]
    if section:
        return f"[{section}]", section, loc[1:]
    return "config", section, loc


def _describe(error: dict[str, Any], data: dict[str, Any]) -> str:
    where, section, loc = _located(list(error["loc"]), data)
    field = ".".join(str(part) for part in loc if not str(part).startswith("function-"))
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden" and not field:
        # An unknown top-level section: loc is just its name.
        close = difflib.get_close_matches(section, list(Config.model_fields), n=1)
        fix = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(_SECTIONS)}"
        return f"config: unknown section {section!r}: {fix}"
    if error["type"] == "extra_forbidden":
        model = _SECTIONS.get(section, Config)
        close = difflib.get_close_matches(field, list(model.model_fields), n=1)
        fix = (
            f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(model.model_fields)}"
        )
        return f"{where}: unknown field {field!r}: {fix}"
    if error["type"] == "missing":
        if not field:
            return f"{where} is required: add the section with its fields"
        return f"{where}: field {field!r} is required: add {field} = ..."
    if error["type"] == "literal_error":
        return f"{where}: field {field!r}: {message}"
    if field:
        got = error.get("input")
        shown = f" (got {got!r})" if got is not None and not isinstance(got, dict | list) else ""
        return f"{where}: field {field!r}: {message}{shown}"
    return f"{where}: {message}"


def parse_config(data: dict[str, Any], source: str = "expiry.toml") -> Config:
    """Validate a parsed TOML document; ConfigError lists every problem."""
    if url := os.environ.get("EXPIRY_DATABASE_URL"):
        data = {**data, "database": {**(data.get("database") or {}), "url": url}}
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(error, data) for error in exc.errors()]  # type: ignore[arg-type]
        # One line, so that the CLI's error is one line on stderr.
        raise ConfigError(f"{source} is invalid: " + "; ".join(problems)) from None


def config_path(path: Path | None = None) -> Path:
    return path or Path(os.environ.get("EXPIRY_CONFIG", "expiry.toml"))


def load_config(path: Path | None = None) -> Config:
    path = config_path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"no config file at {path}: pass --config PATH or set EXPIRY_CONFIG"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return parse_config(data, str(path))
