-- MySQL/MariaDB's named queries for the queue: jobs inserted, claimed, leased, completed, retried, dead-lettered, pruned.
-- (This engine's conventions are at the top of database.sql.)

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
-- that is not the job's gives its attempt back within the budget (postgres/queries/ says
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
-- the snooze's reason (postgres/queries/ says how the wait is kept).
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
