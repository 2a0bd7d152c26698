-- MySQL/MariaDB's named queries for evidence: the ledger (one row per applied window) and the audit log.
-- (This engine's conventions are at the top of database.sql.)

-- name: ledger_insert
-- Claim an operation id for this transaction, with the rows it affected when
-- known. No row back means it already committed before: the caller must do
-- nothing else. A key another transaction holds uncommitted waits for it
-- (innodb_lock_wait_timeout), as on PostgreSQL.
insert into expiry_ledger
    (`key`, policy, run_id, lo, hi, bounds, blocked, action, worker, rows_affected, rows_kept, applied_at)
values (%(key)s, %(policy)s, %(run_id)s, %(lo)s, %(hi)s, %(bounds)s, %(blocked)s, %(action)s,
        %(worker)s, %(rows)s, %(kept)s, $now);
select %(key)s as `key` from dual;

-- name: ledger_get
-- One ledger row.
select * from expiry_ledger where `key` = %(key)s;

-- name: ledger_keep
-- The rows a booked window kept (referenced by other tables' rows) and why,
-- counted in the transaction that booked it.
update expiry_ledger set rows_kept = %(kept)s, blocked = %(blocked)s
where `key` = %(key)s;

-- name: ledger_list
-- A policy's ledger rows booked at or after since (null: all of them), oldest
-- first, at most limit of them: the evidence of what its runs deleted or
-- archived (expiry evidence).
-- Through the policy's runs: both tables are indexed that way.
select l.* from expiry_runs r join expiry_ledger l on l.run_id = r.id
where r.policy = %(policy)s
  and (%(since)s is null or l.applied_at >= %(since)s)
order by l.applied_at, l.`key`
limit %(limit)s;

-- name: ledger_prune
-- Delete, a bounded batch at a time, the ledger rows of runs finished longer
-- ago than the given age ([retention] ledger). An open run's evidence is
-- never touched. (MySQL takes no LIMIT in a subquery of IN: a derived table.)
delete l from expiry_ledger l join (
    select l2.`key` from expiry_runs r join expiry_ledger l2 on l2.run_id = r.id
    where r.state = 'finished'
      and r.finished_at < $now - interval round(%(age)s * 1000000) microsecond
    limit %(limit)s
) old on old.`key` = l.`key`;

-- name: audit_append
-- Append one event to the audit log.
insert into expiry_audit (at, actor, action, policy, run_id, job_key, detail)
values ($now, %(actor)s, %(action)s, %(policy)s, %(run_id)s, %(job_key)s, %(detail)s);

-- name: audit_list
-- The newest audit events, optionally for one policy.
select * from expiry_audit
where (%(policy)s is null or policy = %(policy)s)
order by id desc limit %(limit)s;

-- name: audit_holds_lock
-- Serialize the processes that audit the config's holds, to this transaction's
-- end: two starting at once would both see a new hold and both place it. The
-- first migration's row, locked (it is always there).
select version as locked from expiry_schema_migrations where version = 1 for update;

-- name: audit_holds
-- Every hold placed or lifted, oldest first: what the log says is in force.
select * from expiry_audit where action in ('hold.placed', 'hold.lifted') order by id;

-- name: audit_approvals
-- A run's approval events, oldest first (cleanup/approval.py).
select * from expiry_audit
where run_id = %(run_id)s
  and action in ('run.awaiting_approval', 'run.approved', 'run.approval_expired')
order by id;

-- name: audit_counts
-- Audited events by action and policy, for metrics.
select action, policy, count(*) as n from expiry_audit group by action, policy;

-- name: ledger_minutes
-- Windows and rows applied per policy and minute since a time (minutes with
-- none are absent): the history the dashboard draws. Through the runs open or
-- finished since then, which the ledger's run index serves.
select l.policy, cast(date_format(l.applied_at, '%%Y-%%m-%%d %%H:%%i:00') as datetime) as minute,
       count(*) as windows, coalesce(sum(l.rows_affected), 0) as `rows`
from expiry_runs r join expiry_ledger l on l.run_id = r.id
where (r.finished_at is null or r.finished_at >= %(since)s)
  and l.applied_at >= %(since)s and l.policy is not null
group by l.policy, minute
order by minute, l.policy;
