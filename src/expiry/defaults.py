"""Named defaults. Each one is a decision; the docstring says why."""

from __future__ import annotations

from typing import Final

MAX_PAYLOAD_BYTES = 256 * 1024
"""Payloads carry identifiers, not records: a window is four numbers."""

MAX_ATTEMPTS = 8
"""With the default backoff, eight attempts span about half an hour of retrying."""

LEASE_SECONDS = 60.0
"""A claim is held this long without a heartbeat; workers heartbeat every third of it."""

BACKOFF_BASE_SECONDS = 1.0
"""The base of the backoff: the first retry waits up to 2 × this (full jitter), each
later one up to twice as long as the one before, until the cap."""

BACKOFF_CAP_SECONDS = 600.0
"""No retry waits more than ten minutes."""

POLL_SECONDS = 1.0
"""Polling is the source of truth; NOTIFY only shortens the wait on PostgreSQL."""

SQLITE_POLL_SECONDS = 0.05
"""SQLite has no NOTIFY, so idle workers poll a local file often; it is cheap."""

MYSQL_POLL_SECONDS = 0.1
"""MySQL has no NOTIFY either: an idle worker thread claims every 100 ms (one
index probe per queue it works), so that a due job waits about 50 ms, not half
of ``[worker] poll``."""

RESCUE_SECONDS = 5.0
"""How often the rescuer returns expired claims to the queue."""

CLAIM_BATCH = 100
"""The most jobs a worker loop claims in one round trip (CLAIM_HOLD_SECONDS
bounds it by their durations: slow jobs come a few to a claim). 100 is
pgqueuer's batch in bench/queue_throughput.py; against 16, no-op jobs with
batched acks drained 1.6-2.0x faster here (claim and acknowledgement cost per
row, but their round trips and commits per batch)."""

CLAIM_HOLD_SECONDS = 0.5
"""A worker loop claims about this much work at a time (by its recent jobs'
durations, at most CLAIM_BATCH): many no-op jobs, a few cleanup windows."""

PRUNE_AFTER_SECONDS = 7 * 24 * 3600.0
"""Completed and cancelled jobs are kept a week; the ledger keeps the durable truth."""
SAMPLE_RETENTION_SECONDS = 7 * 24 * 3600.0
"""[retention] samples: each policy's per-minute history is kept a week
(10,080 rows a policy)."""
LEDGER_RETENTION_SECONDS = 400 * 24 * 3600.0
"""[retention] ledger: the evidence of a finished run is kept this long (over a
year, for an annual audit)."""

QUEUE = "default"
"""The queue a job goes to when none is named."""

WINDOW = 10_000
"""Keys per window: small enough that a window commits in well under a second."""

PLAN_PAGE = 500
"""Windows a planning job emits per page before it re-enqueues itself."""

TIME_PAGE_ROWS = 200_000
"""Candidates a time-window planning page reads at most (window x windows):
a page's scan of the timestamp index stays well under a second."""

FIRST_PLAN_PAGE = 16
"""Windows of a run's first page (at most PLAN_PAGE): a short scan, so that the
workers start deleting within milliseconds of the run's opening."""

LOCK_TIMEOUT = "2s"
"""A window waits this long for a row lock held by live traffic, then retries later."""

PARTITION_LOCK_TIMEOUT = "100ms"
"""A partition's detach waits this long for the parent table's lock, then
retries later. Short: DETACH asks for ACCESS EXCLUSIVE on the parent, and every
query of the application's that comes after it queues behind it while it
waits (a 2 s wait behind one long read stalls the table's traffic 2 s)."""

PARTITION_LOCK_RETRY_CAP_SECONDS = 30.0
"""A partition whose detach waited out its lock is retried within 2, 4, 8 ...
seconds of the last try, at most this long: each try stalls the table's
traffic for at most partition_lock_timeout."""

STATEMENT_TIMEOUT = "30s"
"""No cleanup statement runs longer than this."""

TARGET_TRANSACTION_SECONDS = 0.25
"""The worker sizes each cleanup transaction toward this duration."""

NICE_RATIO = 1.0
"""After each cleanup transaction a worker thread rests this many times as long
as the transaction took (as gh-ost's --nice-ratio): live traffic gets the
database back between transactions. bench/foreground_impact.py chose it."""

NICE_WHEN: Final = "busy"
"""nice_ratio's rest gives the database back to the application's sessions:
with none at work (the health monitor's last reading, every health_interval)
there is no one to give it to, and the rest would only slow the cleanup (half
its speed at nice_ratio 1). SQLite cannot tell, so it always rests."""

CALL_TIMEOUT_SECONDS = 10.0
"""A cron call's whole deadline: connect, send and the response together."""
CALL_TIMEOUT_RANGE = (0.1, 600.0)
"""The deadline a cron target may state for its own calls (timeout_seconds):
up to ten minutes, for a target that builds a report before it answers."""

CRON_THREADS = 2
"""Worker threads for cron calls alone, besides the ones that clean."""

HEALTH_INTERVAL_SECONDS = 1.0
"""How often a worker reads the database's health for the throttle: never per row."""

SCHEDULE_LATE_SECONDS = 120.0
"""A scheduled policy's fire not taken this long after it was due says that no
scheduler keeps its schedule (none runs, or none sees this policy): status,
the dashboard and /metrics say it is unscheduled."""

WORKER_STALE_SECONDS = 90.0
"""A worker not seen on the roll for this long (three default heartbeats and
more) may be stopped, stuck or cut off: the workers page says so, and its
throttles no longer count in status and /metrics."""

ACK_DELAY_SECONDS = 0.1
"""A batched acknowledgement (``batched_ack=True``) commits at most this long
after the first job of its batch finished, or sooner once a claim's worth of
jobs (``claim_batch``) wait for it: pgqueuer's figure."""

STALL_PERIODS = 3
"""A run of a scheduled policy is stalled once it has been open for this many of
its schedule's periods: two fires have come and gone and it is still not done."""

STALL_MIN_SECONDS = 600.0
"""...but never before ten minutes: a per-minute schedule's first run over a
backlog is not an incident."""

STALL_UNSCHEDULED_SECONDS = 3600.0
"""A run of a policy without a schedule (triggered runs only) is stalled after an hour."""

OUTAGE_BUDGET_SECONDS = 3600.0
"""How long a database outage (connection lost, shutdown, read-only after a
failover, disk full) may fail a job without spending its attempts: an hour.
Past it, each failure spends an attempt again, as any transient error does."""

OUTAGE_RETRY_CAP_SECONDS = 60.0
"""A job an outage failed retries at least once a minute: it resumes within a
minute of the database, not up to BACKOFF_CAP_SECONDS later."""

STOP_GRACE_SECONDS = 30.0
"""After a SIGTERM or SIGINT, a worker, scheduler or server that has not
finished its work in hand within this long exits at once (as does a second
signal): a window commits whole or not at all and its lease returns it to the
queue, so waiting longer only delays a deploy. Kubernetes' default
terminationGracePeriodSeconds is 30 s: keep ``--stop-grace`` below the time
your supervisor gives before its SIGKILL, so that the exit is expiry's, logged."""

SHRINK_RETRY_SECONDS = 1.0
"""A window whose delete timed out is retried within this long (full
jitter), not after the attempt's growing backoff: each retry is smaller work.
After a lock wait the retry cuts the window around the rows another
transaction holds (one lock wait per window); after a statement timeout it
takes half the rows, so a slow row is isolated in about log2(window) timeouts
and its run does not wait minutes on it."""

UNSPENT_PARTITION_LOCK_SECONDS = 3600.0
"""A partition whose detach waits out its lock behind live traffic spends no
attempt for an hour of such tries (a long report holding the table): past it,
each spends one, so a partition held for ever ends in the dead-letter queue,
said aloud, and never silently."""

UNSPENT_SHRINK_SECONDS = 86400.0
"""A window retried smaller after a timeout spends no attempt for a day of
such retries: each takes half the rows of the one before, so it ends (deleted,
or one row kept as blocked) in about log2(window) of them; max_attempts,
meant for failures that repeat, would dead-letter it first (eight attempts for
the fourteen halvings of a 10,000-row window), and a worker lost on its last
attempt would leave it dead."""

MAX_CRON_TARGETS_PER_KEY = 50
"""The most cron targets one API key may own ([http] max_cron_targets_per_key):
enough for a team's jobs, few enough that one key's slow targets cannot fill
the cron threads (calls are shared fairly across owners as well)."""

MAX_QUEUES_PER_KEY = 100
"""The most application queues holding jobs that one API key's publish scopes
may reach ([http] max_queues_per_key): one key could otherwise make thousands
(each a row of the queue page and of /metrics)."""

MAX_PENDING_PER_KEY = 1_000_000
"""The most jobs not yet final in one key's queues ([http] max_pending_per_key)."""

MAX_PENDING_BYTES_PER_KEY = 1024**3
"""The most bytes of messages not yet final in one key's queues
([http] max_pending_bytes_per_key): 1 GiB."""

UNSPENT_WRITE_SET_SECONDS = 600.0
"""A job whose write set a Galera cluster refuses spends no attempt for this
long: a window or planning page halved at each try fits within a few tries; a
job that cannot shrink (a handler of the application's, one row over the
limit) spends its attempts after that, and ends dead with its reason."""

APPROVE_WITHIN = "24h"
"""How long a run of a policy with ``approve = true`` waits for its approval
before it finishes without deleting anything."""

APPROVAL_RECHECK_SECONDS = 300.0
"""A run awaiting approval is looked at again this often (an approval wakes it
at once): a changed policy previews again, an expired wait finishes the run."""
