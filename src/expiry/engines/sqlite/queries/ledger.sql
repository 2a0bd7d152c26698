-- SQLite's named queries for evidence: the ledger (one row per applied window) and the audit log.
-- (This engine's conventions are at the top of database.sql.)

-- name: ledger_insert
-- Claim an operation id for this transaction, with the rows it affected when
-- known: a window books itself after its guarded delete, in the same
-- IMMEDIATE transaction (target.py). No row back means it already committed
-- before: the caller must do nothing else.
insert into expiry_ledger
    (key, policy, run_id, lo, hi, bounds, blocked, action, worker, rows_affected, rows_kept, applied_at)
values (:key, :policy, :run_id, :lo, :hi, :bounds, :blocked, :action, :worker, :rows, :kept, $now)
on conflict (key) do nothing
returning key;

-- name: ledger_get
-- One ledger row.
select * from expiry_ledger where key = :key;

-- name: ledger_keep
-- The rows a booked window kept (referenced by other tables' rows) and why,
-- counted in the transaction that booked it.
update expiry_ledger set rows_kept = :kept, blocked = :blocked
where key = :key;

-- name: ledger_list
-- A policy's ledger rows booked at or after since (null: all of them), oldest
-- first, at most limit of them: the evidence of what its runs deleted or
-- archived (expiry evidence).
-- Through the policy's runs: both tables are indexed that way. A time read
-- back from its epoch seconds (a double) may come back a hair later than it
-- was stored: a microsecond's slack keeps the row booked at `since` itself.
select l.* from expiry_runs r join expiry_ledger l on l.run_id = r.id
where r.policy = :policy
  and (:since is null or l.applied_at >= :since - 0.000001)
order by l.applied_at, l.key
limit :limit;

-- name: ledger_prune
-- Delete, a bounded batch at a time, the ledger rows of runs finished longer
-- ago than the given age ([retention] ledger). An open run's evidence is
-- never touched.
delete from expiry_ledger where key in (
    select l.key from expiry_runs r join expiry_ledger l on l.run_id = r.id
    where r.state = 'finished' and r.finished_at < $now - :age
    limit :limit
);

-- name: audit_append
-- Append one event to the audit log.
insert into expiry_audit (at, actor, action, policy, run_id, job_key, detail)
values ($now, :actor, :action, :policy, :run_id, :job_key, :detail);

-- name: audit_list
-- The newest audit events, optionally for one policy.
select * from expiry_audit
where (:policy is null or policy = :policy)
order by id desc limit :limit;

-- name: audit_holds_lock
-- Serialize the processes that audit the config's holds: every transaction
-- here is BEGIN IMMEDIATE, one writer at a time, so this reads nothing.
select 1 as locked;

-- name: audit_holds
-- Every hold placed or lifted, oldest first: what the log says is in force.
select * from expiry_audit where action in ('hold.placed', 'hold.lifted') order by id;

-- name: audit_approvals
-- A run's approval events, oldest first (cleanup/approval.py).
select * from expiry_audit
where run_id = :run_id
  and action in ('run.awaiting_approval', 'run.approved', 'run.approval_expired')
order by id;

-- name: audit_counts
-- Audited events by action and policy, for metrics.
select action, policy, count(*) as n from expiry_audit group by action, policy;

-- name: ledger_minutes
-- Windows and rows applied per policy and minute since a time (minutes with
-- none are absent): the history the dashboard draws. Through the runs open or
-- finished since then, which the ledger's run index serves. A time is epoch
-- seconds: its minute is the whole minutes of it.
select l.policy, cast(l.applied_at / 60 as integer) * 60 as minute,
       count(*) as windows, coalesce(sum(l.rows_affected), 0) as rows
from expiry_runs r join expiry_ledger l on l.run_id = r.id
where (r.finished_at is null or r.finished_at >= :since)
  and l.applied_at >= :since and l.policy is not null
group by l.policy, cast(l.applied_at / 60 as integer)
order by minute, l.policy;
