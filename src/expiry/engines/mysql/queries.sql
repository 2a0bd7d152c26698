-- The same named queries as engines/postgres/queries.sql, for MySQL and MariaDB.
-- $now is replaced when the file is loaded by the server's clock in UTC,
-- utc_timestamp(6). MySQL has no UPDATE ... RETURNING: a query that must say
-- which rows it changed is several statements, run in order in one
-- transaction; the rows of the last one that returns rows come back (engine.py). Either the
-- ids are locked first and carried in a session variable as a JSON array, or,
-- for one row, the last statement reads row_count() of the update before it
-- (the connection counts rows matched, not only rows changed). An insert that
-- meets a key that exists already stops the query with no rows back (MySQL's
-- duplicate key, 1062: the statement alone rolls back, the transaction goes
-- on), as ON CONFLICT DO NOTHING does on PostgreSQL. Literal percent signs are
-- doubled: every statement is sent with parameters.

-- name: now
-- The database clock: the only clock expiry trusts.
select $now as now;

-- name: job_existing
-- The keys of a batch that are queued already (job_insert_many inserts the rest).
select j.`key` from expiry_jobs j
join json_table(%(keys)s, '$[*]' columns (k varchar(700) path '$')) b on b.k = j.`key`;

-- name: job_insert_many
-- Enqueue a batch of new keys in one statement from a JSON array. Each job's
-- run_at is either given or now + delay seconds.
insert into expiry_jobs (queue, handler, `key`, payload, priority, max_attempts, run_at, state,
                         run_id, errors, created_at, updated_at)
select t.queue, t.handler, t.k, t.payload, t.priority, t.max_attempts, t.due,
       case when t.due > $now then 'scheduled' else 'available' end, t.run_id, '[]', $now, $now
from (
    select b.*, coalesce(b.run_at, $now + interval round(b.delay * 1000000) microsecond) as due
    from json_table(%(jobs)s, '$[*]' columns (
        queue        varchar(255) path '$.queue',
        handler      varchar(255) path '$.handler',
        k            varchar(700) path '$.key',
        payload      longtext     path '$.payload',
        priority     smallint     path '$.priority',
        max_attempts integer      path '$.max_attempts',
        run_at       datetime(6)  path '$.run_at',
        delay        double       path '$.delay',
        run_id       varchar(700) path '$.run_id')) b
) t;

-- name: job_due_count
-- How many due jobs of one queue a fair-share claim sees (up to 2n, none locked).
select count(*) as n from (
    select 1 from expiry_jobs
    where due_queue = %(queue)s and run_at <= $now
    order by priority, run_at, id
    limit %(look)s
) as due;

-- name: job_due
-- Up to n due jobs of one queue in the order of its expiry_jobs_due index,
-- locked, skipping those another claim holds. The engine merges the queues'
-- candidates and leases the best n in the same transaction.
select id, priority, run_at from expiry_jobs
where due_queue = %(queue)s and run_at <= $now
order by priority, run_at, id
limit %(n)s
for update skip locked;

-- name: job_claim
-- Lease the picked jobs (locked by job_due); the attempt is counted now.
update expiry_jobs
set state = 'running',
    attempt = attempt + 1,
    lease_owner = %(owner)s,
    lease_token = replace(uuid(), '-', ''),
    lease_expires_at = $now + interval round(%(lease)s * 1000000) microsecond,
    attempted_at = $now,
    updated_at = $now
where id in (select v from json_table(%(ids)s, '$[*]' columns (v bigint path '$')) as l);
select * from expiry_jobs
where id in (select v from json_table(%(ids)s, '$[*]' columns (v bigint path '$')) as l);

-- name: job_heartbeat
-- Extend a lease, only while the caller still holds it and it has not expired.
update expiry_jobs
set lease_expires_at = $now + interval round(%(lease)s * 1000000) microsecond, updated_at = $now
where id = %(id)s and lease_token = %(token)s and state = 'running'
  and lease_expires_at > $now;
select %(id)s as id from dual where row_count() > 0;

-- name: job_complete
-- Mark a job completed, only while the caller still holds an unexpired lease.
update expiry_jobs
set state = 'completed', finished_at = $now, updated_at = $now,
    lease_owner = null, lease_token = null, lease_expires_at = null
where id = %(id)s and lease_token = %(token)s and state = 'running'
  and lease_expires_at > $now;
select %(id)s as id from dual where row_count() > 0;

-- name: job_complete_many
-- Complete a group of jobs run in one transaction (group commit), each only
-- while the caller still holds its unexpired lease. Lease tokens are unique,
-- so matching ids and tokens as sets matches each pair.
select id from expiry_jobs
where id in (select v from json_table(%(ids)s, '$[*]' columns (v bigint path '$')) as l)
  and lease_token in (select v from json_table(%(tokens)s, '$[*]' columns (v varchar(64) path '$')) as t)
  and state = 'running' and lease_expires_at > $now
for update;
update expiry_jobs
set state = 'completed', finished_at = $now, updated_at = $now,
    lease_owner = null, lease_token = null, lease_expires_at = null
where id in (select v from json_table(%(ids)s, '$[*]' columns (v bigint path '$')) as l)
  and lease_token in (select v from json_table(%(tokens)s, '$[*]' columns (v varchar(64) path '$')) as t)
  and state = 'running';

-- name: job_fail
-- Record a failed attempt: retryable at now + delay while attempts remain and
-- the error is transient, else dead. Every attempt's error is kept. Only while
-- the caller's lease holds: after it expired, the rescuer decides. A failure
-- that is not the job's gives its attempt back within the budget (postgres/queries.sql says
-- how). MySQL's SET reads the values assigned before it in the same statement:
-- attempt and unspent_since are assigned last, after everything that reads them.
update expiry_jobs
set state = case when %(retry)s and (attempt < max_attempts or (%(unspent)s
                      and coalesce(unspent_since, $now) > $now - interval round(%(budget)s * 1000000) microsecond))
                 then 'retryable' else 'dead' end,
    run_at = case when %(retry)s and (attempt < max_attempts or (%(unspent)s
                       and coalesce(unspent_since, $now) > $now - interval round(%(budget)s * 1000000) microsecond))
                  then $now + interval round(%(delay)s * 1000000) microsecond else run_at end,
    finished_at = case when %(retry)s and (attempt < max_attempts or (%(unspent)s
                       and coalesce(unspent_since, $now) > $now - interval round(%(budget)s * 1000000) microsecond))
                  then null else $now end,
    last_error = %(error)s,
    last_error_kind = %(kind)s,
    errors = json_array_append(errors, '$', json_object(
        'attempt', attempt, 'at', date_format($now, '%%Y-%%m-%%dT%%H:%%i:%%s.%%fZ'),
        'kind', %(kind)s, 'error', %(error)s, 'worker', lease_owner)),
    lease_owner = null, lease_token = null, lease_expires_at = null,
    updated_at = $now,
    attempt = case when %(retry)s and %(unspent)s
                        and coalesce(unspent_since, $now) > $now - interval round(%(budget)s * 1000000) microsecond
                   then greatest(attempt - 1, 0) else attempt end,
    unspent_since = case when %(unspent)s then coalesce(unspent_since, $now) end
where id = %(id)s and lease_token = %(token)s and state = 'running'
  and lease_expires_at > $now;
select state from expiry_jobs where id = %(id)s and row_count() > 0;

-- name: job_release
-- Give a claimed job back without spending an attempt (shutdown, snooze), with
-- the snooze's reason (postgres/queries.sql says how the wait is kept).
update expiry_jobs
set state = case when %(delay)s > 0 then 'scheduled' else 'available' end,
    attempt = greatest(attempt - 1, 0),
    run_at = $now + interval round(%(delay)s * 1000000) microsecond,
    waiting_since = case when %(reason)s is null then null else coalesce(waiting_since, $now) end,
    wait_reason = %(reason)s,
    lease_owner = null, lease_token = null, lease_expires_at = null,
    updated_at = $now
where id = %(id)s and lease_token = %(token)s and state = 'running';
select %(id)s as id from dual where row_count() > 0;

-- name: job_wake
-- Make a snoozed job due now (a run that an earlier one just handed its turn).
update expiry_jobs
set state = 'available', run_at = $now, updated_at = $now
where `key` = %(key)s and state = 'scheduled';
select queue from expiry_jobs where `key` = %(key)s and row_count() > 0;

-- name: job_rescue
-- Return claims whose lease expired to the queue, or to the dead-letter queue
-- when that claim was their last attempt (a job that kills its worker ends dead).
set @expiry_ids = (select coalesce(json_arrayagg(id), '[]') from (
    select id from expiry_jobs
    where state = 'running' and lease_expires_at < $now
    for update) as expired);
update expiry_jobs
set state = case when attempt < max_attempts then 'retryable' else 'dead' end,
    run_at = $now,
    finished_at = case when attempt < max_attempts then null else $now end,
    last_error = concat('lease expired: worker ', coalesce(lease_owner, '?'), ' stopped heartbeating'),
    last_error_kind = 'lease_expired',
    errors = json_array_append(errors, '$', json_object(
        'attempt', attempt, 'at', date_format($now, '%%Y-%%m-%%dT%%H:%%i:%%s.%%fZ'),
        'kind', 'lease_expired', 'error', 'lease expired', 'worker', lease_owner)),
    lease_owner = null, lease_token = null, lease_expires_at = null,
    updated_at = $now
where id in (select v from json_table(@expiry_ids, '$[*]' columns (v bigint path '$')) as l);
select `key`, state, attempt, run_id from expiry_jobs
where id in (select v from json_table(@expiry_ids, '$[*]' columns (v bigint path '$')) as l);

-- name: job_redrive
-- Send dead jobs back to the queue with a fresh attempt budget; history stays.
set @expiry_ids = (select coalesce(json_arrayagg(id), '[]') from (
    select id from expiry_jobs
    where state = 'dead'
      and (%(all)s or `key` in (select v from json_table(%(keys)s, '$[*]' columns (v varchar(700) path '$')) as k))
      and (%(policy)s is null or json_unquote(json_extract(payload, '$.policy')) = %(policy)s)
    for update) as dead);
update expiry_jobs
set state = 'available', attempt = 0, run_at = $now, finished_at = null, updated_at = $now
where id in (select v from json_table(@expiry_ids, '$[*]' columns (v bigint path '$')) as l);
select `key`, run_id, json_unquote(json_extract(payload, '$.policy')) as policy from expiry_jobs
where id in (select v from json_table(@expiry_ids, '$[*]' columns (v bigint path '$')) as l);

-- name: job_discard
-- Cancel dead (or still waiting) jobs; they are kept, as cancelled, for the record.
set @expiry_ids = (select coalesce(json_arrayagg(id), '[]') from (
    select id from expiry_jobs
    where state in ('dead', 'scheduled', 'available', 'retryable')
      and `key` in (select v from json_table(%(keys)s, '$[*]' columns (v varchar(700) path '$')) as k)
    for update) as waiting);
update expiry_jobs
set state = 'cancelled', finished_at = $now, updated_at = $now
where id in (select v from json_table(@expiry_ids, '$[*]' columns (v bigint path '$')) as l);
select `key`, run_id from expiry_jobs
where id in (select v from json_table(@expiry_ids, '$[*]' columns (v bigint path '$')) as l);

-- name: job_get
-- One job by key.
select * from expiry_jobs where `key` = %(key)s;

-- name: job_queues
-- The queue of each job named by id (a receipt's job).
select id, queue from expiry_jobs
where id in (select v from json_table(%(ids)s, '$[*]' columns (v bigint path '$')) as l);

-- name: job_list
-- Jobs in a state, newest first, optionally of one queue.
select * from expiry_jobs
where state = %(state)s and (%(queue)s is null or queue = %(queue)s)
order by updated_at desc, id desc
limit %(limit)s;

-- name: job_prune
-- Delete finished jobs older than the given age, a bounded batch at a time.
delete from expiry_jobs
where state in ('completed', 'cancelled')
  and finished_at < $now - interval round(%(age)s * 1000000) microsecond
limit %(limit)s;

-- name: job_counts
-- Jobs by queue and state.
select queue, state, count(*) as n from expiry_jobs group by queue, state;

-- name: job_oldest_due
-- Age in seconds of the oldest due job per queue.
select due_queue as queue, timestampdiff(microsecond, min(run_at), $now) / 1e6 as age
from expiry_jobs
where due_queue is not null and run_at <= $now
group by due_queue;

-- name: job_running
-- Every running claim and how long it has been held.
select queue, `key`, timestampdiff(microsecond, attempted_at, $now) / 1e6 as held
from expiry_jobs where state = 'running' order by attempted_at;

-- name: job_retries_by_kind
-- Failed attempts by error kind, over jobs still retrying or dead.
select last_error_kind as kind, count(*) as n from expiry_jobs
where state in ('retryable', 'dead') and last_error_kind is not null
group by last_error_kind;

-- name: job_pending_count
-- Jobs not yet final (waiting or running); with due_only, only those due now.
select count(*) as n from expiry_jobs
where (state = 'running'
       or (state in ('scheduled', 'available', 'retryable')
           and (not %(due_only)s or run_at <= $now)))
  and (%(queue)s is null or queue = %(queue)s);

-- name: job_pending_by_queue
-- Per application queue, its jobs not yet final and their messages' bytes (a key's quotas).
select queue, count(*) as n, coalesce(sum(length(payload)), 0) as bytes
from expiry_jobs
where state in ('scheduled', 'available', 'retryable', 'running') and queue not like 'expiry.%%'
group by queue;

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

-- name: run_prune
-- Delete, a bounded batch at a time, the runs finished longer ago than the
-- given age that have no ledger row left.
delete r from expiry_runs r join (
    select r2.id from expiry_runs r2
    where r2.state = 'finished'
      and r2.finished_at < $now - interval round(%(age)s * 1000000) microsecond
      and not exists (select 1 from expiry_ledger l where l.run_id = r2.id)
    limit %(limit)s
) old on old.id = r.id;

-- name: audit_append
-- Append one event to the audit log.
insert into expiry_audit (at, actor, action, policy, run_id, job_key, detail)
values ($now, %(actor)s, %(action)s, %(policy)s, %(run_id)s, %(job_key)s, %(detail)s);

-- name: audit_list
-- The newest audit events, optionally for one policy.
select * from expiry_audit
where (%(policy)s is null or policy = %(policy)s)
order by id desc limit %(limit)s;

-- name: run_insert
-- Open a run; the id is policy:cutoff, so opening it twice is one run.
insert into expiry_runs (id, policy, cutoff, opened_by, opened_at)
values (%(id)s, %(policy)s, %(cutoff)s, %(opened_by)s, $now);
select %(id)s as id from dual;

-- name: run_get
-- One run.
select * from expiry_runs where id = %(id)s;

-- name: run_list
-- The newest runs, optionally of one policy.
select * from expiry_runs
where (%(policy)s is null or policy = %(policy)s)
order by opened_at desc, id desc limit %(limit)s;

-- name: run_add_windows
-- Count the windows a planning page queues; mark planning done on the last
-- page. A cancelled run takes none (no row comes back: the page queues nothing).
update expiry_runs
set windows_planned = windows_planned + %(windows)s,
    planned_at = case when %(done)s then $now else planned_at end,
    state = case when %(done)s then 'running' else state end
where id = %(id)s and cancelled_at is null;
select %(id)s as id from dual where row_count() > 0;

-- name: run_cancel
-- Cancel a run not yet finished: planning is over (a planning run moves on to
-- running, to finish once nothing of it is pending). With superseded_by, a
-- later run of the policy took its place.
update expiry_runs
set cancelled_at = $now, cancelled_by = %(actor)s, superseded_by = %(superseded_by)s,
    planned_at = coalesce(planned_at, $now),
    state = case when state = 'planning' then 'running' else state end
where id = %(id)s and state <> 'finished' and cancelled_at is null;
select %(id)s as id from dual where row_count() > 0;

-- name: run_cancel_jobs
-- A cancelled run's waiting jobs are cancelled; running ones finish.
set @expiry_ids = (select coalesce(json_arrayagg(id), '[]') from (
    select id from expiry_jobs
    where run_id = %(id)s and state in ('scheduled', 'available', 'retryable')
    for update) as waiting);
update expiry_jobs
set state = 'cancelled', finished_at = $now, updated_at = $now
where id in (select v from json_table(@expiry_ids, '$[*]' columns (v bigint path '$')) as l);
select `key` from expiry_jobs
where id in (select v from json_table(@expiry_ids, '$[*]' columns (v bigint path '$')) as l);

-- name: run_finish
-- Mark a planned run finished once none of its jobs is pending.
update expiry_runs r
set r.state = 'finished',
    r.finished_at = coalesce((select max(j.finished_at) from expiry_jobs j where j.run_id = r.id),
                             $now)
where r.id = %(id)s and r.state = 'running'
  and not exists (select 1 from expiry_jobs j
                  where j.run_id = r.id
                    and j.state in ('scheduled', 'available', 'retryable', 'running'));
select %(id)s as id from dual where row_count() > 0;

-- name: run_reopen
-- A finished run whose dead jobs were redriven is open again (its finish
-- time cleared) until they end; a cancelled or superseded run stays finished.
update expiry_runs set state = 'running', finished_at = null
where id in (select v from json_table(%(ids)s, '$[*]' columns (v varchar(700) path '$')) as r)
  and state = 'finished' and cancelled_at is null and superseded_by is null;

-- name: run_finish_idle
-- Finish every planned run none of whose jobs is pending: the sweep for runs
-- whose last job's worker died after its commit, or whose last job ended dead.
set @expiry_ids = (select coalesce(json_arrayagg(id), '[]') from (
    select r.id from expiry_runs r
    where r.state = 'running'
      and not exists (select 1 from expiry_jobs j
                      where j.run_id = r.id
                        and j.state in ('scheduled', 'available', 'retryable', 'running'))
    for update) as idle);
update expiry_runs r
set r.state = 'finished',
    r.finished_at = coalesce((select max(j.finished_at) from expiry_jobs j where j.run_id = r.id),
                             $now)
where r.state = 'running'
  and r.id in (select v from json_table(@expiry_ids, '$[*]' columns (v varchar(700) path '$')) as l)
  and not exists (select 1 from expiry_jobs j
                  where j.run_id = r.id
                    and j.state in ('scheduled', 'available', 'retryable', 'running'));
select id from expiry_runs
where state = 'finished'
  and id in (select v from json_table(@expiry_ids, '$[*]' columns (v varchar(700) path '$')) as l);

-- name: run_jobs
-- A run's jobs by handler and state, with attempts spent, failed attempts and
-- deliveries given again after a lost lease (the rescuer's lease_expired).
select handler, state, count(*) as n, coalesce(sum(attempt), 0) as attempts,
       coalesce(sum(json_length(errors)), 0) as failures,
       coalesce(sum(json_length(json_search(errors, 'all', 'lease_expired', null, '$[*].kind'))),
                0) as redelivered
from expiry_jobs where run_id = %(id)s group by handler, state;

-- name: run_ledger
-- What a run has applied: windows, rows, and rows a foreign key kept.
select count(*) as windows, coalesce(sum(rows_affected), 0) as `rows`, coalesce(sum(rows_kept), 0) as blocked
from expiry_ledger where run_id = %(id)s;

-- name: run_duplicates
-- Duplicate deliveries a run's windows absorbed.
select count(*) as n from expiry_audit
where run_id = %(id)s and action = 'window.duplicate';

-- name: run_turns
-- The policy's open runs in their turn, whether each started, its pending jobs
-- (postgres/queries.sql says what each means).
select r.id, r.cutoff,
       (r.state <> 'planning' or exists (
           select 1 from expiry_jobs j
           where j.run_id = r.id and j.`key` <> concat(r.id, ':plan'))) as started,
       (select count(*) from expiry_jobs j
        where j.run_id = r.id
          and j.state in ('scheduled', 'available', 'retryable', 'running')) as pending,
       (select count(*) from expiry_jobs j
        where j.run_id = r.id
          and (j.state = 'running'
               or (j.state in ('scheduled', 'available', 'retryable') and j.run_at <= $now)))
         as active
from expiry_runs r
where r.policy = %(policy)s and r.state <> 'finished' and r.cancelled_at is null
order by r.cutoff, r.id;

-- name: run_waits
-- What a run's pending jobs wait for: by state and reason (a snooze's reason,
-- a retry's last error kind), how many, one of their errors, since when, and
-- when the first is due.
select state, reason, count(*) as n, max(last_error) as error,
       min(since) as since, min(run_at) as next_at
from (select state, run_at, last_error,
             case when state = 'scheduled' then wait_reason
                  when state = 'retryable' then last_error_kind end as reason,
             case when state = 'scheduled' then coalesce(waiting_since, updated_at)
                  else updated_at end as since
      from expiry_jobs
      where run_id = %(id)s
        and state in ('scheduled', 'available', 'retryable', 'running')) as pending
group by state, reason;

-- name: run_mark_stalled
-- Mark the policy's runs open for longer than %(seconds)s as stalled, each once.
set @expiry_ids = (select coalesce(json_arrayagg(id), '[]') from (
    select id from expiry_runs
    where policy = %(policy)s and state <> 'finished' and stalled_at is null
      and opened_at < $now - interval round(%(seconds)s * 1000000) microsecond
    for update) as stalled);
update expiry_runs
set stalled_at = $now
where id in (select v from json_table(@expiry_ids, '$[*]' columns (v varchar(700) path '$')) as l);
select id, opened_at from expiry_runs
where id in (select v from json_table(@expiry_ids, '$[*]' columns (v varchar(700) path '$')) as l);

-- name: run_open_oldest
-- Per policy with an open run: when its oldest open run was opened.
select policy, min(opened_at) as opened_at
from expiry_runs where state <> 'finished' group by policy;

-- name: policy_totals
-- Rows and windows applied per policy, over the whole ledger.
select policy, count(*) as windows, coalesce(sum(rows_affected), 0) as `rows`
from expiry_ledger where policy is not null group by policy;

-- name: schedule_register
-- First sight of a schedule: start counting fires from now, not from the past.
insert into expiry_schedules (policy, last_fire_at, updated_at) values (%(policy)s, %(now)s, $now);

-- name: schedule_list
-- Every schedule's state.
select policy, paused, paused_by, last_fire_at, updated_at from expiry_schedules order by policy;

-- name: schedule_advance
-- Claim the fire times after %(last)s, up to %(fire)s: a compare-and-set on the
-- last_fire_at this scheduler read, so any number of schedulers open exactly one
-- run per fire (one that read a stale value claims nothing and reads again).
update expiry_schedules set last_fire_at = %(fire)s, updated_at = $now
where policy = %(policy)s and not paused
  and last_fire_at = %(last)s and last_fire_at < %(fire)s;
select %(policy)s as policy from dual where row_count() > 0;

-- name: schedule_set_paused
-- Pause or resume a policy's schedule, saying who paused it (the throttle's
-- stop holds the policy's windows too).
insert into expiry_schedules (policy, paused, paused_by, last_fire_at, updated_at)
values (%(policy)s, %(paused)s, %(by)s, $now, $now)
on duplicate key update paused = values(paused), paused_by = values(paused_by), updated_at = $now;

-- name: schedule_version
-- Changes by other processes (pause/resume, cron targets created, deleted,
-- paused or fired) show up here.
select greatest(
           coalesce((select max(updated_at) from expiry_schedules), timestamp('1970-01-01')),
           coalesce((select max(updated_at) from expiry_cron_targets), timestamp('1970-01-01'))
       ) as version,
       (select count(*) from expiry_schedules) + (select count(*) from expiry_cron_targets) as n;

-- name: key_insert
-- Store a new API key's hash (the secret itself is never stored).
insert into expiry_api_keys (name, hash, scopes, created_at)
values (%(name)s, %(hash)s, %(scopes)s, $now);
select %(name)s as name from dual;

-- name: key_list
-- Every API key, without secrets.
select name, scopes, created_at, revoked_at from expiry_api_keys order by name;

-- name: key_revoke
-- Revoke a key; it stops working at once.
update expiry_api_keys set revoked_at = $now where name = %(name)s and revoked_at is null;
select %(name)s as name from dual where row_count() > 0;

-- name: key_set_scopes
-- Replace the scopes of a key in force.
update expiry_api_keys set scopes = %(scopes)s where name = %(name)s and revoked_at is null;
select %(name)s as name from dual where row_count() > 0;

-- name: key_active
-- Hashes of every key still in force.
select name, hash, scopes from expiry_api_keys where revoked_at is null;

-- name: idempotency_begin
-- Record that a request with this key is in flight; no row back means it exists.
insert into expiry_idempotency (api_key, `key`, request_hash, created_at)
values (%(api_key)s, %(key)s, %(hash)s, $now);
select %(key)s as `key` from dual;

-- name: idempotency_get
-- A stored request: its body hash and, once finished, its response.
select request_hash, status, body from expiry_idempotency
where api_key = %(api_key)s and `key` = %(key)s and created_at > $now - interval 24 hour;

-- name: idempotency_finish
-- Store the first response for replay.
update expiry_idempotency set status = %(status)s, body = %(body)s
where api_key = %(api_key)s and `key` = %(key)s;

-- name: idempotency_forget
-- Drop an in-flight record whose request failed before answering, or one expired.
delete from expiry_idempotency
where (api_key = %(api_key)s and `key` = %(key)s) or created_at < $now - interval 24 hour;

-- name: cron_insert
-- Create a cron target; the name is unique.
insert into expiry_cron_targets (name, http_url, schedule, timezone, secret, owner, last_fire_at,
                                 created_at, updated_at)
values (%(name)s, %(http_url)s, %(schedule)s, %(timezone)s, %(secret)s, %(owner)s, $now, $now, $now);
select %(name)s as name from dual;

-- name: cron_list
-- Every cron target.
select * from expiry_cron_targets order by name;

-- name: cron_get
-- One cron target.
select * from expiry_cron_targets where name = %(name)s;

-- name: cron_delete
-- Delete a cron target (its call history stays).
delete from expiry_cron_targets where name = %(name)s;
select %(name)s as name from dual where row_count() > 0;

-- name: cron_set_paused
-- Pause or resume a cron target.
update expiry_cron_targets set paused = %(paused)s, updated_at = $now where name = %(name)s;
select %(name)s as name from dual where row_count() > 0;

-- name: cron_update
-- Point a cron target at another URL, schedule or time zone (its fires so far stay).
update expiry_cron_targets
set http_url = %(http_url)s, schedule = %(schedule)s, timezone = %(timezone)s, updated_at = $now
where name = %(name)s;
select %(name)s as name from dual where row_count() > 0;

-- name: cron_advance
-- Claim a cron target's fire time: compare-and-set on the last_fire_at the
-- scheduler read, as for policies.
update expiry_cron_targets set last_fire_at = %(fire)s, updated_at = $now
where name = %(name)s and not paused
  and last_fire_at = %(last)s and last_fire_at < %(fire)s;
select %(name)s as name from dual where row_count() > 0;

-- name: cron_call_insert
-- Record one call's outcome.
insert into expiry_cron_calls (name, fire_time, attempt, status, duration_ms, response, error, at)
values (%(name)s, %(fire_time)s, %(attempt)s, %(status)s, %(duration_ms)s, %(response)s,
        %(error)s, $now);

-- name: cron_calls
-- A cron target's newest calls.
select * from expiry_cron_calls where name = %(name)s order by id desc limit %(limit)s;

-- name: audit_counts
-- Audited events by action and policy, for metrics.
select action, policy, count(*) as n from expiry_audit group by action, policy;

-- name: worker_seen
-- A worker process's roll call at each heartbeat: who it is, what it works,
-- how many jobs it holds and which queues rest.
insert into expiry_workers (name, host, pid, threads, queues, resting, holding, health,
                            started_at, seen_at)
values (%(name)s, %(host)s, %(pid)s, %(threads)s, %(queues)s, %(resting)s, %(holding)s,
        %(health)s, $now, $now)
on duplicate key update threads = values(threads), queues = values(queues),
    resting = values(resting), holding = values(holding), health = values(health), seen_at = $now;

-- name: worker_forget
-- Workers not seen for a day are forgotten (killed without a word).
delete from expiry_workers where seen_at < $now - interval 1 day;

-- name: worker_gone
-- A worker that stopped cleanly leaves the roll.
delete from expiry_workers where name = %(name)s;

-- name: worker_list
-- The roll, newest first, with how long ago each was seen (the database's clock).
select name, host, pid, threads, queues, resting, holding, health, started_at, seen_at,
       timestampdiff(microsecond, seen_at, $now) / 1e6 as seen_seconds_ago
from expiry_workers order by started_at desc, name;

-- name: lock_holders
-- The other transactions holding row locks (MariaDB names a lock's table only
-- while someone waits for it: every such transaction is shown, oldest first).
select t.trx_mysql_thread_id as pid, coalesce(p.user, '') as application,
       coalesce(p.command, '') as state,
       timestampdiff(microsecond, t.trx_started, now(6)) / 1000000 as seconds,
       left(coalesce(t.trx_query, p.info, ''), 200) as query
from information_schema.innodb_trx t
left join information_schema.processlist p on p.id = t.trx_mysql_thread_id
where t.trx_mysql_thread_id <> connection_id() and t.trx_rows_locked > 0
  and %(table)s is not null
order by t.trx_started, t.trx_mysql_thread_id
limit 5;
