"""Plain data: jobs, their states, what the queue reports, and the rows the
engine reads back for runs, schedules, cron targets, keys, idempotency, the
ledger and the audit log (times as aware datetimes, in UTC)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

RESERVED_PREFIX = "expiry."
"""Queues and handlers whose names start with this are expiry's own: a policy's
planning, partition and window jobs, and cron calls. Applications and the
public HTTP API cannot name them, and only such jobs are part of runs."""


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
"""A job waiting for a claim (due or not)."""
UNFINISHED_STATES = (*WAITING_STATES, JobState.RUNNING)
"""A job not yet completed, dead or cancelled."""
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
    wait_reason: str | None = None
    """Why a snoozed job waits (a run ahead of it, a quarantine, a rate limit)."""
    waiting_since: datetime | None = None
    """When its wait began: kept across snoozes, cleared when it is released
    for another cause."""


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


# -- rows the engine reads back (engines/seam/: one method per named query) ---------


@dataclass(frozen=True)
class Gates:
    """What a worker holds back now: the cleanup's pacing, read before each claim."""

    resting: dict[str, float] = field(default_factory=dict)
    """Queue -> the monotonic time (this process's clock) it may be claimed
    from again: a policy resting after its last window (nice_ratio,
    max_rows_per_second). Its jobs wait in the queue meanwhile."""
    limits: dict[str, int] = field(default_factory=dict)
    """Queue -> the most jobs one claim takes from it: 1 for a paced policy,
    whose every window waits for the rest after the one before."""


@dataclass(frozen=True)
class Run:
    """A cleanup run; its id is ``policy:cutoff``, so opening a cutoff twice is one run."""

    id: str
    policy: str
    cutoff: datetime
    opened_by: str
    state: str
    """planning, running (every window planned) or finished"""
    windows_planned: int
    opened_at: datetime
    planned_at: datetime | None
    finished_at: datetime | None
    cancelled_at: datetime | None = None
    """Set when an operator cancelled it: its waiting jobs were cancelled and
    planning stopped; it finishes once its running jobs end."""
    cancelled_by: str | None = None
    superseded_by: str | None = None
    """The later run of the policy that took its place before it started: its
    cutoff deletes every row this run would have."""
    stalled_at: datetime | None = None
    """When the run was found open past its policy's stall_after (audited once)."""


@dataclass(frozen=True)
class RunTurn:
    """An open run of a policy, as its turn is decided: runs go in cutoff order,
    and one not yet started gives way to a later one."""

    id: str
    cutoff: datetime
    started: bool
    """It queued more than its first planning job, or was planned."""
    pending: int
    """Its jobs not yet completed, dead or cancelled."""
    active: int = 0
    """Of those, the ones running or due now: the run is moving. The rest wait
    for a retry's backoff or a snooze."""


@dataclass(frozen=True)
class RunWait:
    """A run's pending jobs in one state, waiting for one reason."""

    state: str
    reason: str | None
    """scheduled: the snooze's reason; retryable: the last error's kind."""
    n: int
    error: str | None
    """One of their last errors (retryable ones)."""
    since: datetime
    """When the oldest of them began waiting (or last changed state)."""
    next_at: datetime
    """When the first of them is due."""


@dataclass(frozen=True)
class LockHolder:
    """Another session holding locks a window's lock wait may have waited behind."""

    pid: int
    """The server's id of the session (PostgreSQL's pid, MySQL's connection id)."""
    application: str
    """Its application_name (PostgreSQL) or user (MySQL)."""
    state: str
    """What it does now: "idle in transaction", "active", "Sleep"..."""
    seconds: float | None
    """How long its transaction has been open."""
    query: str
    """Its current or last statement (shortened; hidden without the privilege to see it)."""


@dataclass(frozen=True)
class RunJobs:
    """A run's jobs of one handler in one state."""

    handler: str
    state: str
    n: int
    attempts: int
    """attempts spent by these jobs, summed"""
    failures: int
    """failed attempts recorded on these jobs, summed"""
    redelivered: int = 0
    """deliveries given again after a lost lease (the rescuer's lease_expired), summed"""


@dataclass(frozen=True)
class RunTotals:
    """What a run (or a policy, over the whole ledger) has applied."""

    windows: int
    """ledger rows: windows, or parts of windows, applied"""
    rows: int
    """rows those windows deleted or archived"""
    blocked: int = 0
    """rows a foreign key kept from being deleted (each booked alone)"""


@dataclass(frozen=True)
class LedgerMinute:
    """Windows and rows one policy applied in one minute (the ledger's)."""

    policy: str
    minute: datetime
    windows: int
    rows: int


@dataclass(frozen=True)
class Sample:
    """One policy's state at one minute, kept in the database (the history the
    dashboard draws; a minute keeps its first sample): its queue's jobs not yet
    final (backlog), of those the ones waiting to retry, its dead letters, the
    seconds since its oldest expired row expired (None: unreadable), and what
    held its throttle as a live worker reported it (None: open)."""

    policy: str
    minute: datetime
    backlog: int
    retrying: int
    dead: int
    oldest_age: float | None
    held: str | None = None


@dataclass(frozen=True)
class PolicyTotals:
    policy: str
    windows: int
    rows: int


@dataclass(frozen=True)
class Schedule:
    """A scheduled policy's state: whether it is paused and the last fire claimed."""

    policy: str
    paused: bool
    last_fire_at: datetime | None
    updated_at: datetime
    last_fire_stored: Any = field(default=None, repr=False)
    """``last_fire_at`` exactly as the engine stores it (epoch seconds on SQLite):
    schedule_advance's compare-and-set matches on it, and epoch seconds need not
    survive a round trip through datetime."""
    paused_by: str | None = None
    """Who paused it: "throttle" for a critical health reading (its windows
    wait too), else None (an operator's pause stops the schedule only)."""


@dataclass(frozen=True)
class CronTarget:
    """An HTTP cron target, secret included (for signing its calls)."""

    name: str
    http_url: str
    schedule: str
    timezone: str
    secret: str = field(repr=False)
    paused: bool
    last_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime
    last_fire_stored: Any = field(default=None, repr=False)
    """``last_fire_at`` exactly as stored, for cron_advance's compare-and-set
    (as Schedule.last_fire_stored)."""
    owner: str | None = None
    """The API key that created it (None: made before keys had scopes, or by an
    operator; admin keys only)."""
    timeout: float | None = None
    """Its calls' whole deadline in seconds (None: [http] call_timeout)."""


@dataclass(frozen=True)
class CronCall:
    """One call of a cron target and its outcome."""

    id: int
    name: str
    fire_time: datetime
    attempt: int
    status: int | None
    duration_ms: float | None
    response: str | None
    error: str | None
    at: datetime


@dataclass(frozen=True)
class WorkerSeen:
    """A worker process on the roll: what it said at its last heartbeat."""

    name: str
    """host:pid:suffix, the lease_owner of every job it holds."""
    host: str
    pid: int
    threads: int
    queues: list[str]
    resting: dict[str, float]
    """Queue -> seconds its rest had left then (a paced policy's)."""
    holding: int
    started_at: datetime
    seen_at: datetime
    seen_seconds_ago: float
    health: dict[str, Any] = field(default_factory=dict)
    """Policy -> its throttle in this worker: state, reason, rate, seconds held
    by reason, last readings (health.Health.snapshot)."""


@dataclass(frozen=True)
class ApiKey:
    """An API key without its secret (only its hash is stored)."""

    name: str
    created_at: datetime
    revoked_at: datetime | None
    scopes: tuple[str, ...] = ("admin",)


@dataclass(frozen=True)
class ActiveKey:
    """A key in force, as the API's check reads it: its hash and scopes."""

    hash: str
    scopes: tuple[str, ...]


@dataclass(frozen=True)
class IdempotencyRecord:
    """A request seen under an Idempotency-Key: its body's hash and, once
    answered, the response (status and JSON body) to replay."""

    request_hash: str
    status: int | None
    body: str | None


@dataclass(frozen=True)
class LedgerEntry:
    """The record of one applied operation (a window, or a part of one)."""

    key: str
    policy: str | None
    run_id: str | None
    lo: int | None
    hi: int | None
    action: str | None
    rows_affected: int
    worker: str | None
    applied_at: datetime
    bounds: str | None = None
    """A range that is not two integer keys: a time window's (timestamp, key)
    positions, or a dropped or detached partition's name."""
    blocked: str | None = None
    """The rows a foreign key kept this window from deleting, and the reason."""
    kept: int = 0
    """How many expired rows the window kept (referenced by other tables' rows)."""


class AuditAction(enum.StrEnum):
    """What the append-only audit log records: every action name in one place."""

    RUN_OPENED = "run.opened"
    RUN_CANCELLED = "run.cancelled"
    RUN_SUPERSEDED = "run.superseded"
    """A run not yet started gave way to a later run of its policy, whose cutoff
    covers it (coalesced: one run plans, not each)."""
    RUN_STALLED = "run.stalled"
    """A run open for longer than its policy's stall_after (once per run)."""
    RUN_AWAITING_APPROVAL = "run.awaiting_approval"
    """A run of a policy with ``approve = true`` stopped after its planning
    checks, before any window: its preview (candidates, a sample of keys, the
    policy's hash). Written again when the policy changed since."""
    RUN_APPROVED = "run.approved"
    """Someone approved a run's preview (the policy's hash it was made under)."""
    RUN_APPROVAL_EXPIRED = "run.approval_expired"
    """A run awaited approval longer than its policy's approve_within: it
    finished without a window."""
    WINDOW_DUPLICATE = "window.duplicate"
    """A window delivered again after its ledger row committed: nothing changed
    (also written by PostgreSQL's expiry.window_apply, and counted per run)."""
    JOB_LEASE_LOST = "job.lease_lost"
    JOB_REDRIVEN = "job.redriven"
    JOB_DISCARDED = "job.discarded"
    SCHEDULE_FIRED = "schedule.fired"
    SCHEDULE_MISSED = "schedule.missed"
    HOLD_PLACED = "hold.placed"
    """A [[hold]] in force as the config now has it (new, or changed): written
    by the first worker, scheduler or server that reads the config."""
    HOLD_LIFTED = "hold.lifted"
    """A [[hold]] the log shows in force that the config no longer has."""
    POLICY_PAUSED = "policy.paused"
    POLICY_RESUMED = "policy.resumed"
    CRON_CREATED = "cron.created"
    CRON_UPDATED = "cron.updated"
    CRON_MISSED = "cron.missed"
    CRON_PAUSED = "cron.paused"
    CRON_RESUMED = "cron.resumed"
    CRON_DELETED = "cron.deleted"
    CRON_CALLED = "cron.called"
    CRON_FAILED = "cron.failed"
    """A call failed at its last attempt and its target's next fire, soon,
    calls again: recorded and audited, not dead-lettered (one a minute would
    flood the dead-letter queue for a per-minute target that is down)."""
    KEY_CREATED = "key.created"
    KEY_REVOKED = "key.revoked"
    KEY_SCOPED = "key.scoped"
    SIGNED_IN = "dashboard.signed_in"
    SIGN_IN_REFUSED = "dashboard.sign_in_refused"
    SIGNED_OUT = "dashboard.signed_out"


@dataclass(frozen=True)
class AuditEvent:
    id: int
    at: datetime
    actor: str
    action: str
    policy: str | None
    run_id: str | None
    job_key: str | None
    detail: dict[str, Any]


@dataclass(frozen=True)
class AuditCount:
    """Audited events of one action and policy, for metrics."""

    action: str
    policy: str | None
    n: int


# -- a policy's table -------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A column of a policy's table, as the engine's catalog describes it."""

    name: str
    type: str
    indexed: bool
    """The column leads an index (the planner's and the watermark's probes use it)."""


@dataclass(frozen=True)
class Relation:
    """What a policy's table (or archive table) is."""

    kind: str
    """"table", "view", "materialized view", "foreign table" or another kind's name."""
    own: bool
    """One of expiry's own tables."""
    deletable: bool
    """Rows can be deleted from it (a table, or an automatically updatable view)."""
    insertable: bool
    partitioned: bool = False
    """Declaratively partitioned (PostgreSQL): its rows live in partitions."""
    rowid: str | None = None
    """The hidden row id every index of the table ends with, where there is one
    and it is not the key itself (SQLite's rowid): time windows break ties of
    a timestamp with it, so that any index on the timestamp orders them."""
    clustered: str | None = None
    """The one-column primary key every secondary index ends with, as InnoDB
    clusters a table on it: an index on the timestamp orders rows sharing one
    value by it, with no sort (no (timestamp, key) index to advise)."""


@dataclass(frozen=True)
class Layout:
    """How a table lies on disk, from the planner's statistics (PostgreSQL)."""

    pages: int
    """Its heap's pages now."""
    rows: int
    """The planner's estimate of its rows (-1: never analyzed)."""
    correlation: float | None
    """pg_stats' correlation of a column's order with the heap's (None: no statistics)."""


@dataclass(frozen=True)
class Index:
    """An index of a policy's table: its columns in order."""

    name: str
    columns: tuple[str, ...]
    unique: bool


@dataclass(frozen=True)
class Reference:
    """A foreign key from another table to a policy's table."""

    table: str
    """The referencing table."""
    columns: tuple[str, ...]
    """Its referencing columns."""
    referenced: tuple[str, ...]
    """The policy table's columns they reference."""
    on_delete: str
    """"cascade", "set null", "set default", "restrict" or "no action"."""
    indexed: bool = True
    """Some index of the referencing table leads with the referencing columns
    (in any order): the database finds a deleted row's references by it.
    Without one, every row a window deletes scans the referencing table."""


@dataclass(frozen=True)
class Partition:
    """A partition of a partitioned table, with its range on the partition key."""

    schema: str
    name: str
    key: str | None
    """The partition key's one column, or None (several, an expression, a list
    or hash partitioning: never dropped whole)."""
    upper: str | None
    """The range's exclusive upper bound as the catalog writes it (a literal of
    the key's type), or None (MAXVALUE, or the default partition)."""
    rows: int
    """The planner's estimate of its rows (-1 before an ANALYZE)."""


@dataclass(frozen=True)
class WindowApply:
    """One window's work for Engine.window_apply: its statements, built by
    cleanup/target.py in the engine's own placeholders, and what books it."""

    delete: str
    """Delete the window's expired rows not yet booked (the ledger guard)."""
    move: str | None
    """Archive: delete and insert into the archive in one statement, where the
    engine can (PostgreSQL); None for a delete."""
    copy: str | None
    """Archive, where the engine copies then deletes (SQLite); None for a delete."""
    label: str
    """A comment naming the table, for whoever reads the server's activity."""
    params: dict[str, Any]
    """lo, hi (or the positions), key and the cutoff as the engine binds them."""
    key: str
    policy: str
    run_id: str
    action: str
    worker: str | None
    lo: int | None
    hi: int | None
    """A key window's bounds; None for a time window (``positions``)."""
    positions: list[Any] | None
    """A time window's bounds as the statement reads them: lower timestamp,
    lower tie, upper timestamp, upper tie (the lower two None for a run's first
    window); None for a key window."""
    bounds: str | None
    """A time window's range as the ledger records it."""
    job: Job | None
    """Completed in the same statement or transaction, when given."""
    lock_timeout_ms: int
    statement_timeout_ms: int


@dataclass(frozen=True)
class Replica:
    """A standby as the primary sees it (pg_stat_replication)."""

    name: str
    replay_position: int | None
    """The WAL position it has replayed up to (bytes); None without pg_monitor."""
    replay_lag: float | None
    """pg_stat_replication's own replay_lag in seconds (None: none measured lately)."""
    visible: bool = True
    """False when this role may not see the standby's positions (no pg_monitor);
    True with no replay_position: the standby has not reported one yet."""


@dataclass(frozen=True)
class FlowControl:
    """A Galera node's flow control (its wsrep status): how long the cluster
    has paused replication for it, and what waits to be applied here."""

    paused_ns: int
    """Nanoseconds of flow-control pause since the node started
    (wsrep_flow_control_paused_ns): the difference of two readings over the
    time between them is the share of that time the cluster stood still."""
    recv_queue: int
    """Write sets received and not yet applied on this node (wsrep_local_recv_queue)."""
    node: str = ""
    """The node's identity in the cluster (wsrep_gcomm_uuid, new at each start):
    two readings of the pause compare only on the same node."""


@dataclass(frozen=True)
class VacuumStats:
    """A table's vacuum pressure (pg_stat_user_tables)."""

    live_tuples: int
    dead_tuples: int
    last_vacuum: datetime | None
    """The later of the last manual and the last automatic vacuum."""
    last_analyze: datetime | None

    @property
    def dead_ratio(self) -> float:
        return self.dead_tuples / max(1, self.live_tuples + self.dead_tuples)
