-- The same named queries as engines/postgres/queries.sql, for SQLite.
-- $now is replaced when the file is loaded by SQLite's own clock in epoch
-- seconds: (julianday('now') - 2440587.5) * 86400.0. SQLite has one writer at
-- a time, so claims need no SKIP LOCKED: an IMMEDIATE transaction is enough.

-- name: now
-- The database clock: the only clock expiry trusts.
select $now as now;

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
-- (postgres/queries.sql says how).
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
-- the snooze's reason (postgres/queries.sql says how the wait is kept).
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

-- name: run_prune
-- Delete, a bounded batch at a time, the runs finished longer ago than the
-- given age that have no ledger row left.
delete from expiry_runs where id in (
    select r.id from expiry_runs r
    where r.state = 'finished' and r.finished_at < $now - :age
      and not exists (select 1 from expiry_ledger l where l.run_id = r.id)
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

-- name: run_insert
-- Open a run; the id is policy:cutoff, so opening it twice is one run.
insert into expiry_runs (id, policy, cutoff, opened_by, opened_at)
values (:id, :policy, :cutoff, :opened_by, $now)
on conflict (id) do nothing
returning id;

-- name: run_get
-- One run.
select * from expiry_runs where id = :id;

-- name: run_list
-- The newest runs, optionally of one policy.
select * from expiry_runs
where (:policy is null or policy = :policy)
order by opened_at desc, id desc limit :limit;

-- name: run_add_windows
-- Count the windows a planning page queues; mark planning done on the last
-- page. A cancelled run takes none (no row comes back: the page queues nothing).
update expiry_runs
set windows_planned = windows_planned + :windows,
    state = case when :done then 'running' else state end,
    planned_at = case when :done then $now else planned_at end
where id = :id and cancelled_at is null
returning id;

-- name: run_cancel
-- Cancel a run not yet finished: planning is over. With superseded_by, a later
-- run of the policy took its place.
update expiry_runs
set cancelled_at = $now, cancelled_by = :actor, superseded_by = :superseded_by,
    state = case when state = 'planning' then 'running' else state end,
    planned_at = coalesce(planned_at, $now)
where id = :id and state <> 'finished' and cancelled_at is null
returning id;

-- name: run_cancel_jobs
-- A cancelled run's waiting jobs are cancelled; running ones finish.
update expiry_jobs
set state = 'cancelled', finished_at = $now, updated_at = $now
where run_id = :id and state in ('scheduled', 'available', 'retryable')
returning key;

-- name: run_finish
-- Mark a planned run finished once none of its jobs is pending.
update expiry_runs
set state = 'finished',
    finished_at = coalesce((select max(finished_at) from expiry_jobs j
                            where j.run_id = expiry_runs.id), $now)
where id = :id and state = 'running'
  and not exists (select 1 from expiry_jobs j
                  where j.run_id = expiry_runs.id
                    and j.state in ('scheduled', 'available', 'retryable', 'running'))
returning id;

-- name: run_reopen
-- A finished run whose dead jobs were redriven is open again (its finish
-- time cleared) until they end; a cancelled or superseded run stays finished.
update expiry_runs set state = 'running', finished_at = null
where id in (select value from json_each(:ids)) and state = 'finished'
  and cancelled_at is null and superseded_by is null;

-- name: run_finish_idle
-- Finish every planned run none of whose jobs is pending: the sweep for runs whose
-- last job's worker died after its commit, or whose last job ended dead.
update expiry_runs
set state = 'finished',
    finished_at = coalesce((select max(finished_at) from expiry_jobs j
                            where j.run_id = expiry_runs.id), $now)
where state = 'running'
  and not exists (select 1 from expiry_jobs j
                  where j.run_id = expiry_runs.id
                    and j.state in ('scheduled', 'available', 'retryable', 'running'))
returning id;

-- name: run_jobs
-- A run's jobs by handler and state, with attempts spent, failed attempts and
-- deliveries given again after a lost lease (the rescuer's lease_expired).
select handler, state, count(*) as n, coalesce(sum(attempt), 0) as attempts,
       coalesce(sum(json_array_length(errors)), 0) as failures,
       coalesce(sum((select count(*) from json_each(errors) e
                     where json_extract(e.value, '$.kind') = 'lease_expired')), 0) as redelivered
from expiry_jobs where run_id = :id group by handler, state;

-- name: run_ledger
-- What a run has applied: windows, rows, and rows a foreign key kept.
select count(*) as windows, coalesce(sum(rows_affected), 0) as rows, coalesce(sum(rows_kept), 0) as blocked
from expiry_ledger where run_id = :id;

-- name: run_duplicates
-- Duplicate deliveries a run's windows absorbed.
select count(*) as n from expiry_audit
where run_id = :id and action = 'window.duplicate';

-- name: run_turns
-- The policy's open runs in their turn, whether each started, its pending jobs
-- (postgres/queries.sql says what each means).
select r.id, r.cutoff,
       (r.state <> 'planning' or exists (
           select 1 from expiry_jobs j
           where j.run_id = r.id and j.key <> r.id || ':plan')) as started,
       (select count(*) from expiry_jobs j
        where j.run_id = r.id
          and j.state in ('scheduled', 'available', 'retryable', 'running')) as pending,
       (select count(*) from expiry_jobs j
        where j.run_id = r.id
          and (j.state = 'running'
               or (j.state in ('scheduled', 'available', 'retryable') and j.run_at <= $now)))
         as active
from expiry_runs r
where r.policy = :policy and r.state <> 'finished' and r.cancelled_at is null
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
      where run_id = :id
        and state in ('scheduled', 'available', 'retryable', 'running')) as pending
group by state, reason;

-- name: run_mark_stalled
-- Mark the policy's runs open for longer than :seconds as stalled, each once.
update expiry_runs
set stalled_at = $now
where policy = :policy and state <> 'finished' and stalled_at is null
  and opened_at < $now - :seconds
returning id, opened_at;

-- name: run_open_oldest
-- Per policy with an open run: when its oldest open run was opened.
select policy, min(opened_at) as opened_at
from expiry_runs where state <> 'finished' group by policy;

-- name: policy_totals
-- Rows and windows applied per policy, over the whole ledger.
select policy, count(*) as windows, coalesce(sum(rows_affected), 0) as rows
from expiry_ledger where policy is not null group by policy;

-- name: schedule_register
-- First sight of a schedule: start counting fires from now, not from the past.
insert into expiry_schedules (policy, last_fire_at, updated_at) values (:policy, :now, $now)
on conflict (policy) do nothing;

-- name: schedule_list
-- Every schedule's state.
select policy, paused, paused_by, last_fire_at, updated_at from expiry_schedules order by policy;

-- name: schedule_advance
-- Claim the fire times after :last, up to :fire: a compare-and-set on the
-- last_fire_at this scheduler read (a stale reader claims nothing).
update expiry_schedules set last_fire_at = :fire, updated_at = $now
where policy = :policy and not paused and last_fire_at = :last and last_fire_at < :fire
returning policy;

-- name: schedule_set_paused
-- Pause or resume a policy's schedule, saying who paused it.
insert into expiry_schedules (policy, paused, paused_by, last_fire_at, updated_at)
values (:policy, :paused, :by, $now, $now)
on conflict (policy) do update
set paused = excluded.paused, paused_by = excluded.paused_by, updated_at = $now
returning policy;

-- name: schedule_version
-- Changes by other processes (pause/resume, cron targets created, deleted,
-- paused or fired) show up here.
select max(coalesce((select max(updated_at) from expiry_schedules), 0),
           coalesce((select max(updated_at) from expiry_cron_targets), 0)) as version,
       (select count(*) from expiry_schedules) + (select count(*) from expiry_cron_targets) as n;

-- name: key_insert
-- Store a new API key's hash (the secret itself is never stored).
insert into expiry_api_keys (name, hash, scopes, created_at) values (:name, :hash, :scopes, $now)
on conflict (name) do nothing returning name;

-- name: key_list
-- Every API key, without secrets.
select name, scopes, created_at, revoked_at from expiry_api_keys order by name;

-- name: key_revoke
-- Revoke a key; it stops working at once.
update expiry_api_keys set revoked_at = $now where name = :name and revoked_at is null
returning name;

-- name: key_set_scopes
-- Replace the scopes of a key in force.
update expiry_api_keys set scopes = :scopes
where name = :name and revoked_at is null returning name;

-- name: key_active
-- Hashes of every key still in force.
select name, hash, scopes from expiry_api_keys where revoked_at is null;

-- name: idempotency_begin
-- Record that a request with this key is in flight; no row back means it exists.
insert into expiry_idempotency (api_key, key, request_hash, created_at)
values (:api_key, :key, :hash, $now)
on conflict (api_key, key) do nothing returning key;

-- name: idempotency_get
-- A stored request: its body hash and, once finished, its response.
select request_hash, status, body from expiry_idempotency
where api_key = :api_key and key = :key and created_at > $now - 86400;

-- name: idempotency_finish
-- Store the first response for replay.
update expiry_idempotency set status = :status, body = :body
where api_key = :api_key and key = :key;

-- name: idempotency_forget
-- Drop an in-flight record whose request failed before answering, or one expired.
delete from expiry_idempotency
where (api_key = :api_key and key = :key) or created_at < $now - 86400;

-- name: cron_insert
-- Create a cron target; the name is unique.
insert into expiry_cron_targets (name, http_url, schedule, timezone, secret, owner,
                                 last_fire_at, created_at, updated_at)
values (:name, :http_url, :schedule, :timezone, :secret, :owner, $now, $now, $now)
on conflict (name) do nothing returning name;

-- name: cron_list
-- Every cron target.
select * from expiry_cron_targets order by name;

-- name: cron_get
-- One cron target.
select * from expiry_cron_targets where name = :name;

-- name: cron_delete
-- Delete a cron target (its call history stays).
delete from expiry_cron_targets where name = :name returning name;

-- name: cron_set_paused
-- Pause or resume a cron target.
update expiry_cron_targets set paused = :paused, updated_at = $now where name = :name
returning name;

-- name: cron_update
-- Point a cron target at another URL, schedule or time zone (its fires so far stay).
update expiry_cron_targets
set http_url = :http_url, schedule = :schedule, timezone = :timezone, updated_at = $now
where name = :name
returning name;

-- name: cron_advance
-- Claim a cron target's fire time: compare-and-set on the last_fire_at the
-- scheduler read, as for policies.
update expiry_cron_targets set last_fire_at = :fire, updated_at = $now
where name = :name and not paused and last_fire_at = :last and last_fire_at < :fire
returning name;

-- name: cron_call_insert
-- Record one call's outcome.
insert into expiry_cron_calls (name, fire_time, attempt, status, duration_ms, response, error, at)
values (:name, :fire_time, :attempt, :status, :duration_ms, :response, :error, $now);

-- name: cron_calls
-- A cron target's newest calls.
select * from expiry_cron_calls where name = :name order by id desc limit :limit;

-- name: audit_counts
-- Audited events by action and policy, for metrics.
select action, policy, count(*) as n from expiry_audit group by action, policy;

-- name: worker_seen
-- A worker process's roll call at each heartbeat (postgres/queries.sql).
insert into expiry_workers (name, host, pid, threads, queues, resting, holding, health,
                            started_at, seen_at)
values (:name, :host, :pid, :threads, :queues, :resting, :holding, :health, $now, $now)
on conflict (name) do update
set threads = excluded.threads, queues = excluded.queues, resting = excluded.resting,
    holding = excluded.holding, health = excluded.health, seen_at = $now;

-- name: worker_forget
-- Workers not seen for a day are forgotten (SQLite runs one statement a query).
delete from expiry_workers where seen_at < $now - 86400;

-- name: worker_gone
-- A worker that stopped cleanly leaves the roll.
delete from expiry_workers where name = :name;

-- name: worker_list
-- The roll, newest first, with how long ago each was seen.
select name, host, pid, threads, queues, resting, holding, health, started_at, seen_at,
       $now - seen_at as seen_seconds_ago
from expiry_workers order by started_at desc, name;

-- name: lock_holders
-- SQLite has one writer and no sessions to name: a lock wait there is the
-- database being busy, and nothing more can be said of who holds it.
select 0 as pid, '' as application, '' as state, null as seconds, '' as query
where :table is null;
