"""The config's sections beside the policies: [database], [http], [worker]
with the throttle's knobs every policy shares, [[replica]] and [retention]."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from .. import defaults
from ..engines.kinds import SUPPORTED, kind_of
from .fields import Duration, Strict, check_listen, check_zone


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
    max_flow_control: float | None = Field(None, gt=0, lt=1)
    """Hold while a Galera cluster spent more than this share of the last
    health_interval paused for flow control (wsrep_flow_control_paused_ns: a
    node fell behind applying the others' writes; pt-archiver's --max-flow-ctl)."""
    critical_flow_control: float | None = Field(None, gt=0, lt=1)
    max_recv_queue: int | None = Field(None, ge=1)
    """Hold while more write sets than this wait to be applied on the node
    expiry is connected to (wsrep_local_recv_queue)."""
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
        for name in ("replica_lag", "active_backends", "latency_ratio", "flow_control"):
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
    samples: Duration = Field(defaults.SAMPLE_RETENTION_SECONDS, ge=3600)
    """Each policy's per-minute history (backlog, retries, dead letters, the
    oldest expired row's age, throttle holds) is kept this long. At least an
    hour."""
