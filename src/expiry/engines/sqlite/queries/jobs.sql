-- SQLite's named queries for the queue: jobs inserted, claimed, leased, completed, retried, dead-lettered, pruned.
-- (This engine's conventions are at the top of database.sql.)

-- name: job_insert_many
-- Enqueue a batch in one statement from a JSON array; existing keys are skipped.
insert into expiry_jobs (queue, handler, key, payload, priority, max_attempts, run_at, state,
                         run_id, created_at, updated_at)
select t.queue, t.handler, t.key, t.payload, t.priority, t.max_attempts, t.due,
       case when t.due > $now then 'scheduled' else 'available' end, t.run_id, $now, $now
from (
    select json_extract(value, '$.queue') as queue,
           json_extract(value, '$.handler') as handler,
           json_extract(value, '$.key') as key,
           json(json_extract(value, '$.payload')) as payload,
           json_extract(value, '$.priority') as priority,
           json_extract(value, '$.max_attempts') as max_attempts,
           json_extract(value, '$.run_id') as run_id,
           coalesce(json_extract(value, '$.run_at'), $now + json_extract(value, '$.delay')) as due
    from json_each(:jobs)
) t
where true
on conflict (key) do nothing
returning key, state;

-- name: job_due
-- Up to n due jobs of one queue in the order of its expiry_jobs_due index
-- (`queue in (...)` would sort the whole backlog). The engine merges the
-- queues' candidates and claims the best n in the same IMMEDIATE transaction.
select id, priority, run_at from expiry_jobs
where state in ('scheduled', 'available', 'retryable')
  and queue = :queue
  and run_at <= $now
order by priority, run_at, id
limit :n;

-- name: job_claim
-- Lease the picked jobs; the attempt is counted now.
update expiry_jobs
set state = 'running',
    attempt = attempt + 1,
    lease_owner = :owner,
    lease_token = lower(hex(randomblob(16))),
    lease_expires_at = $now + :lease,
    attempted_at = $now,
    updated_at = $now
where id in (select value from json_each(:ids))
returning *;

-- name: job_heartbeat
-- Extend a lease, only while the caller still holds it and it has not expired.
update expiry_jobs
set lease_expires_at = $now + :lease, updated_at = $now
where id = :id and lease_token = :token and state = 'running'
  and lease_expires_at > $now
returning id;

-- name: job_complete
-- Mark a job completed, only while the caller still holds an unexpired lease.
update expiry_jobs
set state = 'completed', finished_at = $now, updated_at = $now,
    lease_owner = null, lease_token = null, lease_expires_at = null
where id = :id and lease_token = :token and state = 'running'
  and lease_expires_at > $now
returning id;

-- name: job_complete_many
-- Complete a group of jobs run in one transaction (group commit), each only
-- while the caller still holds its unexpired lease. Lease tokens are unique, so
-- matching ids and tokens as sets matches each pair.
update expiry_jobs
set state = 'completed', finished_at = $now, updated_at = $now,
    lease_owner = null, lease_token = null, lease_expires_at = null
where id in (select value from json_each(:ids))
  and lease_token in (select value from json_each(:tokens))
  and state = 'running' and lease_expires_at > $now
returning id;

-- name: job_fail
-- Record a failed attempt: retryable at now + delay while attempts remain and
-- the error is transient, else dead. Every attempt's error is kept. A
-- failure that is not the job's gives its attempt back within the budget
-- (postgres/queries/ says how).
update expiry_jobs
set state = case when :retry and (attempt < max_attempts or (:unspent
                      and coalesce(unspent_since, $now) > $now - :budget))
                 then 'retryable' else 'dead' end,
    run_at = case when :retry and (attempt < max_attempts or (:unspent
                       and coalesce(unspent_since, $now) > $now - :budget))
                  then $now + :delay else run_at end,
    finished_at = case when :retry and (attempt < max_attempts or (:unspent
                       and coalesce(unspent_since, $now) > $now - :budget))
                  then null else $now end,
    attempt = case when :retry and :unspent and coalesce(unspent_since, $now) > $now - :budget
                   then max(attempt - 1, 0) else attempt end,
    unspent_since = case when :unspent then coalesce(unspent_since, $now) end,
    last_error = :error,
    last_error_kind = :kind,
    errors = json_insert(errors, '$[#]', json_object(
        'attempt', attempt, 'at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), 'kind', :kind, 'error', :error, 'worker', lease_owner)),
    lease_owner = null, lease_token = null, lease_expires_at = null,
    updated_at = $now
where id = :id and lease_token = :token and state = 'running'
  and lease_expires_at > $now
returning state;

-- name: job_release
-- Give a claimed job back without spending an attempt (shutdown, snooze), with
-- the snooze's reason (postgres/queries/ says how the wait is kept).
update expiry_jobs
set state = case when :delay > 0 then 'scheduled' else 'available' end,
    attempt = max(attempt - 1, 0),
    run_at = $now + :delay,
    wait_reason = :reason,
    waiting_since = case when :reason is null then null else coalesce(waiting_since, $now) end,
    lease_owner = null, lease_token = null, lease_expires_at = null,
    updated_at = $now
where id = :id and lease_token = :token and state = 'running'
returning id;

-- name: job_wake
-- Make a snoozed job due now (a run that an earlier one just handed its turn).
update expiry_jobs
set state = 'available', run_at = $now, updated_at = $now
where key = :key and state = 'scheduled'
returning queue;

-- name: job_rescue
-- Return claims whose lease expired to the queue, or to the dead-letter queue
-- when that claim was their last attempt.
update expiry_jobs
set state = case when attempt < max_attempts then 'retryable' else 'dead' end,
    run_at = $now,
    finished_at = case when attempt < max_attempts then null else $now end,
    last_error = 'lease expired: worker ' || coalesce(lease_owner, '?') || ' stopped heartbeating',
    last_error_kind = 'lease_expired',
    errors = json_insert(errors, '$[#]', json_object(
        'attempt', attempt, 'at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), 'kind', 'lease_expired',
        'error', 'lease expired', 'worker', lease_owner)),
    lease_owner = null, lease_token = null, lease_expires_at = null,
    updated_at = $now
where state = 'running' and lease_expires_at < $now
returning key, state, attempt, run_id;

-- name: job_redrive
-- Send dead jobs back to the queue with a fresh attempt budget; history stays.
update expiry_jobs
set state = 'available', attempt = 0, run_at = $now, finished_at = null, updated_at = $now
where state = 'dead'
  and (:all or key in (select value from json_each(:keys)))
  and (:policy is null or json_extract(payload, '$.policy') = :policy)
returning key, run_id, json_extract(payload, '$.policy') as policy;

-- name: job_discard
-- Cancel dead (or still waiting) jobs; they are kept, as cancelled, for the record.
update expiry_jobs
set state = 'cancelled', finished_at = $now, updated_at = $now
where state in ('dead', 'scheduled', 'available', 'retryable')
  and key in (select value from json_each(:keys))
returning key, run_id;

-- name: job_get
-- One job by key.
select * from expiry_jobs where key = :key;

-- name: job_queues
-- The queue of each job named by id (a receipt's job).
select id, queue from expiry_jobs where id in (select value from json_each(:ids));

-- name: job_list
-- Jobs in a state, newest first, optionally of one queue.
select * from expiry_jobs
where state = :state and (:queue is null or queue = :queue)
order by updated_at desc, id desc
limit :limit;

-- name: job_prune
-- Delete finished jobs older than the given age, a bounded batch at a time.
delete from expiry_jobs where id in (
    select id from expiry_jobs
    where state in ('completed', 'cancelled') and finished_at < $now - :age
    limit :limit
);

-- name: job_counts
-- Jobs by queue and state.
select queue, state, count(*) as n from expiry_jobs group by queue, state;

-- name: job_oldest_due
-- Age in seconds of the oldest due job per queue.
select queue, $now - min(run_at) as age
from expiry_jobs
where state in ('scheduled', 'available', 'retryable') and run_at <= $now
group by queue;

-- name: job_running
-- Every running claim and how long it has been held.
select queue, key, $now - attempted_at as held
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
           and (not :due_only or run_at <= $now)))
  and (:queue is null or queue = :queue);

-- name: job_pending_by_queue
-- Per application queue, its jobs not yet final and their messages' bytes (a key's quotas).
select queue, count(*) as n, coalesce(sum(length(cast(payload as blob))), 0) as bytes
from expiry_jobs
where state in ('scheduled', 'available', 'retryable', 'running') and queue not like 'expiry.%'
group by queue;
