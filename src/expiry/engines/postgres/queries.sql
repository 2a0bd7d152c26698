-- name: now
-- The database clock: the only clock expiry trusts.
select now() as now;

-- name: job_insert_many
-- Enqueue a batch in one statement; a key that exists already is skipped (the
-- first of a key repeated in the batch is taken). Each job is numbered (its
-- row's id) in the batch's order and claims its key in expiry.job_keys.
-- Each job's run_at is either given or now() + delay seconds.
with given as materialized (
    select u.*, nextval('expiry.jobs_id_seq') as id,
           coalesce(u.run_at, now() + make_interval(secs => u.delay)) as due
    from unnest(%(queues)b::text[], %(handlers)b::text[], %(keys)b::text[], %(payloads)b::text[],
                %(priorities)b::int[], %(max_attempts)b::int[], %(run_ats)b::timestamptz[],
                %(delays)b::float8[], %(run_ids)b::text[])
         as u(queue, handler, key, payload, priority, max_attempts, run_at, delay, run_id)
),
taken as (
    insert into expiry.job_keys (key, job_id) select key, id from given
    on conflict (key) do nothing
    returning job_id
)
insert into expiry.jobs (id, queue, handler, key, payload, priority, max_attempts, run_at, state, run_id)
overriding system value
select t.id, t.queue, t.handler, t.key, t.payload::jsonb, t.priority, t.max_attempts, t.due,
       case when t.due > now() then 'scheduled' else 'available' end, t.run_id
from given t
where t.id in (select job_id from taken)
order by t.id
returning key, state;

-- name: job_notify
-- Wake listening workers; a hint only, sent when the transaction commits.
select pg_notify('expiry_jobs', %(queue)s);

-- name: job_claim
-- Lease up to n due jobs, by priority, the queues taking turns, then run_at.
-- Each queue is read in the order of its jobs_due index (a LATERAL per queue:
-- `queue = any(...)` would sort the whole backlog on every claim), at most its
-- own limit (1 for a paced policy's queue: each of its windows waits for the
-- rest after the one before), then the best n are taken: the first due job of
-- every queue before the second of any, so that one queue's backlog does not
-- hold back the others (one policy's windows another policy's plan). SKIP
-- LOCKED in a CTE locks the rows a queue's LIMIT picked; the attempt is counted now.
-- A fair-share claim (a worker's) takes at most half of the due jobs it sees,
-- rounded up, looking at no more than 2n a queue: near the end of a backlog
-- the last jobs spread over the workers, instead of one worker holding a batch
-- while the others have nothing left to do.
-- The picked ids are matched as an array: a join with the CTE, whose size the
-- planner cannot know (the fair share's LIMIT), was planned as a hash join over a
-- sequential scan of the whole job table, 15 ms a claim at 20,000 jobs.
-- The claim commits without waiting for its WAL to reach disk (synchronous_commit
-- off, for this transaction only): lost in a crash, a claim only leaves its jobs
-- available, and a job's own transaction, durable, flushes the claim's WAL first.
with async_commit as (select set_config('synchronous_commit', 'off', true)),
wanted as (
    select q.name, least(q.n, %(n)s) as n
    from unnest(%(queues)s::text[], %(limits)s::int[]) as q(name, n)
),
seen as (
    select count(*) as due
    from wanted q
    cross join lateral (
        select 1 from expiry.jobs
        where %(fair_share)s
          and state in ('scheduled', 'available', 'retryable')
          and queue = q.name
          and run_at <= now()
        order by priority, run_at, id
        limit 2 * q.n
    ) due
),
locked as (
    select due.id, due.priority, due.run_at, q.name
    from wanted q
    cross join lateral (
        select id, priority, run_at from expiry.jobs
        where state in ('scheduled', 'available', 'retryable')
          and queue = q.name
          and run_at <= now()
        order by priority, run_at, id
        limit q.n
        for update skip locked
    ) due
),
picked as (
    select id from (
        select id, priority, run_at,
               row_number() over (partition by name order by priority, run_at, id) as turn
        from locked
    ) t
    order by priority, turn, run_at, id
    limit (select case when %(fair_share)s then least(%(n)s, (due + 1) / 2) else %(n)s end
           from seen)
)
update expiry.jobs j
set state = 'running',
    attempt = j.attempt + 1,
    lease_owner = %(owner)s,
    lease_token = gen_random_uuid()::text,
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    attempted_at = now(),
    updated_at = now()
from async_commit
where j.id = any(array(select id from picked))
returning j.*;

-- name: job_heartbeat
-- Extend a lease, only while the caller still holds it and it has not expired.
update expiry.jobs
set lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
where id = %(id)s and lease_token = %(token)s and state = 'running'
  and lease_expires_at > now()
returning id;

-- name: job_complete
-- Mark a job completed, only while the caller still holds an unexpired lease:
-- the rule of expiry.job_complete (migration 0006), which window_apply shares.
select id from (select expiry.job_complete(%(id)s, %(token)s) as id) as done
where id is not null;

-- name: job_complete_strict
-- Complete a job as its transaction's last statement, sent with the COMMIT in
-- one round trip: raises EX001 (LeaseLost) when the lease has moved on, which
-- aborts the transaction, so the COMMIT behind it commits nothing.
select expiry.job_complete_strict(%(id)s, %(token)s) as id;

-- name: job_complete_many
-- Complete a group of jobs run in one transaction (group commit), each only
-- while the caller still holds its unexpired lease: expiry.job_complete's rule
-- as one set-based UPDATE (a call per job would cost a call per job). Lease
-- tokens are unique, so matching ids and tokens as sets matches each pair.
update expiry.jobs
set state = 'completed', finished_at = now(), updated_at = now(),
    lease_owner = null, lease_token = null, lease_expires_at = null
where id = any(%(ids)s::bigint[]) and lease_token = any(%(tokens)s::text[])
  and state = 'running' and lease_expires_at > now()
returning id;

-- name: job_fail
-- Record a failed attempt: retryable at now() + delay while attempts remain
-- and the error is transient, else dead. Every attempt's error is kept. Only
-- while the caller's lease holds: after it expired, the rescuer decides.
-- A failure that is not the job's (%(unspent)s: a database outage, a window
-- that timed out and is retried smaller) gives its attempt back while the
-- streak of such failures began (unspent_since) less than %(budget)s seconds
-- ago; any other failure ends the streak. Each SET reads the row as it was,
-- so the refund's test is written where it decides.
update expiry.jobs
set state = case when %(retry)s and (attempt < max_attempts or (%(unspent)s
                      and coalesce(unspent_since, now()) > now() - make_interval(secs => %(budget)s)))
                 then 'retryable' else 'dead' end,
    run_at = case when %(retry)s and (attempt < max_attempts or (%(unspent)s
                       and coalesce(unspent_since, now()) > now() - make_interval(secs => %(budget)s)))
                  then now() + make_interval(secs => %(delay)s) else run_at end,
    finished_at = case when %(retry)s and (attempt < max_attempts or (%(unspent)s
                       and coalesce(unspent_since, now()) > now() - make_interval(secs => %(budget)s)))
                  then null else now() end,
    attempt = case when %(retry)s and %(unspent)s
                        and coalesce(unspent_since, now()) > now() - make_interval(secs => %(budget)s)
                   then greatest(attempt - 1, 0) else attempt end,
    unspent_since = case when %(unspent)s then coalesce(unspent_since, now()) end,
    last_error = %(error)s,
    last_error_kind = %(kind)s,
    errors = errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempt, 'at', now(), 'kind', %(kind)s::text,
        'error', %(error)s::text, 'worker', lease_owner)),
    lease_owner = null, lease_token = null, lease_expires_at = null,
    updated_at = now()
where id = %(id)s and lease_token = %(token)s and state = 'running'
  and lease_expires_at > now()
returning state;

-- name: job_release
-- Give a claimed job back without spending an attempt (shutdown, snooze). A
-- snooze says why it waits, and the wait's start is kept across snoozes; a
-- release without a reason (shutdown) clears both.
update expiry.jobs
set state = case when %(delay)s > 0 then 'scheduled' else 'available' end,
    attempt = greatest(attempt - 1, 0),
    run_at = now() + make_interval(secs => %(delay)s),
    wait_reason = %(reason)s,
    waiting_since = case when %(reason)s::text is null then null
                         else coalesce(waiting_since, now()) end,
    lease_owner = null, lease_token = null, lease_expires_at = null,
    updated_at = now()
where id = %(id)s and lease_token = %(token)s and state = 'running'
returning id;

-- name: job_wake
-- Make a snoozed job due now (a run that an earlier one just handed its turn),
-- and hint the idle workers of its queue.
with woken as (
    update expiry.jobs
    set state = 'available', run_at = now(), updated_at = now()
    where id = (select job_id from expiry.job_keys where key = %(key)s) and state = 'scheduled'
    returning queue
)
select w.queue from woken w cross join lateral (select pg_notify('expiry_jobs', w.queue)) as hint;

-- name: job_rescue
-- Return claims whose lease expired to the queue, or to the dead-letter queue
-- when that claim was their last attempt (a job that kills its worker ends dead).
update expiry.jobs
set state = case when attempt < max_attempts then 'retryable' else 'dead' end,
    run_at = now(),
    finished_at = case when attempt < max_attempts then null else now() end,
    last_error = 'lease expired: worker ' || coalesce(lease_owner, '?') || ' stopped heartbeating',
    last_error_kind = 'lease_expired',
    errors = errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempt, 'at', now(), 'kind', 'lease_expired',
        'error', 'lease expired', 'worker', lease_owner)),
    lease_owner = null, lease_token = null, lease_expires_at = null,
    updated_at = now()
where state = 'running' and lease_expires_at < now()
returning key, state, attempt, run_id;

-- name: job_redrive
-- Send dead jobs back to the queue with a fresh attempt budget; history stays.
update expiry.jobs
set state = 'available', attempt = 0, run_at = now(), finished_at = null, updated_at = now()
where state = 'dead'
  and (%(all)s or id in (select job_id from expiry.job_keys where key = any(%(keys)s::text[])))
  and (%(policy)s::text is null or payload->>'policy' = %(policy)s)
returning key, run_id, payload->>'policy' as policy;

-- name: job_discard
-- Cancel dead (or still waiting) jobs; they are kept, as cancelled, for the record.
update expiry.jobs
set state = 'cancelled', finished_at = now(), updated_at = now()
where state in ('dead', 'scheduled', 'available', 'retryable')
  and id in (select job_id from expiry.job_keys where key = any(%(keys)s::text[]))
returning key, run_id;

-- name: job_get
-- One job by key.
select j.* from expiry.job_keys k join expiry.jobs j on j.id = k.job_id where k.key = %(key)s;

-- name: job_queues
-- The queue of each job named by id (a receipt's job).
select id, queue from expiry.jobs where id = any(%(ids)s::bigint[]);

-- name: job_list
-- Jobs in a state, newest first, optionally of one queue.
select * from expiry.jobs
where state = %(state)s and (%(queue)s::text is null or queue = %(queue)s)
order by updated_at desc, id desc
limit %(limit)s;

-- name: job_prune
-- Delete finished jobs older than the given age, a bounded batch at a time,
-- and free their keys.
with old as (
    select id, key from expiry.jobs
    where state in ('completed', 'cancelled')
      and finished_at < now() - make_interval(secs => %(age)s)
    limit %(limit)s
),
freed as (
    delete from expiry.job_keys k using old where k.key = old.key and k.job_id = old.id
)
delete from expiry.jobs j using old where j.id = old.id;

-- name: job_counts
-- Jobs by queue and state.
select queue, state, count(*) as n from expiry.jobs group by queue, state;

-- name: job_oldest_due
-- Age in seconds of the oldest due job per queue.
select queue, extract(epoch from now() - min(run_at))::float8 as age
from expiry.jobs
where state in ('scheduled', 'available', 'retryable') and run_at <= now()
group by queue;

-- name: job_running
-- Every running claim and how long it has been held.
select queue, key, extract(epoch from now() - attempted_at)::float8 as held
from expiry.jobs where state = 'running' order by attempted_at;

-- name: job_retries_by_kind
-- Failed attempts by error kind, over jobs still retrying or dead.
select last_error_kind as kind, count(*) as n from expiry.jobs
where state in ('retryable', 'dead') and last_error_kind is not null
group by last_error_kind;

-- name: job_pending_count
-- Jobs not yet final (waiting or running); with due_only, only those due now.
select count(*) as n from expiry.jobs
where (state = 'running'
       or (state in ('scheduled', 'available', 'retryable')
           and (not %(due_only)s or run_at <= now())))
  and (%(queue)s::text is null or queue = %(queue)s);

-- name: job_pending_by_queue
-- Per application queue, its jobs not yet final and their messages' bytes (a key's quotas).
select queue, count(*) as n, coalesce(sum(octet_length(payload::text)), 0)::bigint as bytes
from expiry.jobs
where state in ('scheduled', 'available', 'retryable', 'running') and queue not like 'expiry.%%'
group by queue;

-- name: ledger_insert
-- Claim an operation id for this transaction, with the rows it affected when
-- known: a window books itself after its guarded delete, in the same
-- transaction (target.py). No row back means it already committed before: the
-- caller must do nothing else.
insert into expiry.ledger
    (key, policy, run_id, lo, hi, bounds, blocked, action, worker, rows_affected, rows_kept)
values (%(key)s, %(policy)s, %(run_id)s, %(lo)s, %(hi)s, %(bounds)s, %(blocked)s, %(action)s,
        %(worker)s, %(rows)s, %(kept)s)
on conflict (key) do nothing
returning key;

-- name: ledger_get
-- One ledger row.
select * from expiry.ledger where key = %(key)s;

-- name: ledger_keep
-- The rows a booked window kept (referenced by other tables' rows) and why,
-- counted in the transaction that booked it.
update expiry.ledger set rows_kept = %(kept)s, blocked = %(blocked)s
where key = %(key)s;

-- name: ledger_list
-- A policy's ledger rows booked at or after since (null: all of them), oldest
-- first, at most limit of them: the evidence of what its runs deleted or
-- archived (expiry evidence).
-- Through the policy's runs: both tables are indexed that way.
select l.* from expiry.runs r join expiry.ledger l on l.run_id = r.id
where r.policy = %(policy)s
  and (%(since)s::timestamptz is null or l.applied_at >= %(since)s)
order by l.applied_at, l.key
limit %(limit)s;

-- name: ledger_prune
-- Delete, a bounded batch at a time, the ledger rows of runs finished longer
-- ago than the given age ([retention] ledger), and then those runs once no
-- ledger row of theirs is left. An open run's evidence is never touched.
with old as (
    select l.key from expiry.runs r join expiry.ledger l on l.run_id = r.id
    where r.state = 'finished' and r.finished_at < now() - make_interval(secs => %(age)s)
    limit %(limit)s
)
delete from expiry.ledger l using old where l.key = old.key;

-- name: run_prune
-- Delete, a bounded batch at a time, the runs finished longer ago than the
-- given age that have no ledger row left.
delete from expiry.runs where id in (
    select r.id from expiry.runs r
    where r.state = 'finished' and r.finished_at < now() - make_interval(secs => %(age)s)
      and not exists (select 1 from expiry.ledger l where l.run_id = r.id)
    limit %(limit)s
);

-- name: audit_append
-- Append one event to the audit log.
insert into expiry.audit (actor, action, policy, run_id, job_key, detail)
values (%(actor)s, %(action)s, %(policy)s, %(run_id)s, %(job_key)s, %(detail)s::jsonb);

-- name: audit_list
-- The newest audit events, optionally for one policy.
select * from expiry.audit
where (%(policy)s::text is null or policy = %(policy)s)
order by id desc limit %(limit)s;

-- name: run_insert
-- Open a run; the id is policy:cutoff, so opening it twice is one run.
insert into expiry.runs (id, policy, cutoff, opened_by)
values (%(id)s, %(policy)s, %(cutoff)s, %(opened_by)s)
on conflict (id) do nothing
returning id;

-- name: run_get
-- One run.
select * from expiry.runs where id = %(id)s;

-- name: run_list
-- The newest runs, optionally of one policy.
select * from expiry.runs
where (%(policy)s::text is null or policy = %(policy)s)
order by opened_at desc, id desc limit %(limit)s;

-- name: run_add_windows
-- Count the windows a planning page queues; mark planning done on the last
-- page. A cancelled run takes none (no row comes back: the page queues nothing).
update expiry.runs
set windows_planned = windows_planned + %(windows)s,
    state = case when %(done)s then 'running' else state end,
    planned_at = case when %(done)s then now() else planned_at end
where id = %(id)s and cancelled_at is null
returning id;

-- name: run_cancel
-- Cancel a run not yet finished: planning is over (a planning run moves on to
-- running, to finish once nothing of it is pending). With superseded_by, a later
-- run of the policy took its place.
update expiry.runs
set cancelled_at = now(), cancelled_by = %(actor)s, superseded_by = %(superseded_by)s,
    state = case when state = 'planning' then 'running' else state end,
    planned_at = coalesce(planned_at, now())
where id = %(id)s and state <> 'finished' and cancelled_at is null
returning id;

-- name: run_cancel_jobs
-- A cancelled run's waiting jobs are cancelled; running ones finish.
update expiry.jobs
set state = 'cancelled', finished_at = now(), updated_at = now()
where run_id = %(id)s and state in ('scheduled', 'available', 'retryable')
returning key;

-- name: run_finish
-- Mark a planned run finished once none of its jobs is pending, and tell
-- whoever waits for it (a hint, sent at commit: LISTEN expiry_runs).
with finished as (
    update expiry.runs r
    set state = 'finished',
        finished_at = coalesce((select max(finished_at) from expiry.jobs j where j.run_id = r.id),
                               now())
    where r.id = %(id)s and r.state = 'running'
      and not exists (select 1 from expiry.jobs j
                      where j.run_id = r.id
                        and j.state in ('scheduled', 'available', 'retryable', 'running'))
    returning id
)
select f.id from finished f cross join lateral (select pg_notify('expiry_runs', f.id)) as hint;

-- name: run_reopen
-- A finished run whose dead jobs were redriven is open again (its finish
-- time cleared) until they end; a cancelled or superseded run stays finished.
update expiry.runs set state = 'running', finished_at = null
where id = any(%(ids)s::text[]) and state = 'finished'
  and cancelled_at is null and superseded_by is null;

-- name: run_finish_idle
-- Finish every planned run none of whose jobs is pending: the sweep for runs whose
-- last job's worker died after its commit, or whose last job ended dead. Hints
-- as run_finish.
with finished as (
    update expiry.runs r
    set state = 'finished',
        finished_at = coalesce((select max(finished_at) from expiry.jobs j where j.run_id = r.id),
                               now())
    where r.state = 'running'
      and not exists (select 1 from expiry.jobs j
                      where j.run_id = r.id
                        and j.state in ('scheduled', 'available', 'retryable', 'running'))
    returning id
)
select f.id from finished f cross join lateral (select pg_notify('expiry_runs', f.id)) as hint;

-- name: run_jobs
-- A run's jobs by handler and state, with attempts spent, failed attempts and
-- deliveries given again after a lost lease (the rescuer's lease_expired).
select handler, state, count(*) as n, coalesce(sum(attempt), 0) as attempts,
       coalesce(sum(jsonb_array_length(errors)), 0) as failures,
       coalesce(sum((select count(*) from jsonb_array_elements(errors) e
                     where e->>'kind' = 'lease_expired')), 0) as redelivered
from expiry.jobs where run_id = %(id)s group by handler, state;

-- name: run_ledger
-- What a run has applied: windows, rows, and rows a foreign key kept.
select count(*) as windows, coalesce(sum(rows_affected), 0) as rows, coalesce(sum(rows_kept), 0) as blocked
from expiry.ledger where run_id = %(id)s;

-- name: run_duplicates
-- Duplicate deliveries a run's windows absorbed.
select count(*) as n from expiry.audit
where run_id = %(id)s and action = 'window.duplicate';

-- name: run_turns
-- The policy's open runs (not finished, not cancelled) in their turn: by cutoff,
-- then id. A run has started once it queued anything beyond its first planning
-- job (windows, partitions, the next page) or was planned; pending: its jobs not
-- yet completed, dead or cancelled; active: those of them running or due now
-- (the others wait for a retry's backoff or a snooze).
select r.id, r.cutoff,
       (r.state <> 'planning' or exists (
           select 1 from expiry.jobs j
           where j.run_id = r.id and j.key <> r.id || ':plan')) as started,
       (select count(*) from expiry.jobs j
        where j.run_id = r.id
          and j.state in ('scheduled', 'available', 'retryable', 'running')) as pending,
       (select count(*) from expiry.jobs j
        where j.run_id = r.id
          and (j.state = 'running'
               or (j.state in ('scheduled', 'available', 'retryable') and j.run_at <= now())))
         as active
from expiry.runs r
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
      from expiry.jobs
      where run_id = %(id)s
        and state in ('scheduled', 'available', 'retryable', 'running')) as pending
group by state, reason;

-- name: run_mark_stalled
-- Mark the policy's runs open for longer than %(seconds)s as stalled, each once:
-- the runs marked now (the caller audits them).
update expiry.runs
set stalled_at = now()
where policy = %(policy)s and state <> 'finished' and stalled_at is null
  and opened_at < now() - make_interval(secs => %(seconds)s)
returning id, opened_at;

-- name: run_open_oldest
-- Per policy with an open run: when its oldest open run was opened.
select policy, min(opened_at) as opened_at
from expiry.runs where state <> 'finished' group by policy;

-- name: policy_totals
-- Rows and windows applied per policy, over the whole ledger.
select policy, count(*) as windows, coalesce(sum(rows_affected), 0) as rows
from expiry.ledger where policy is not null group by policy;

-- name: schedule_register
-- First sight of a schedule: start counting fires from now, not from the past.
insert into expiry.schedules (policy, last_fire_at) values (%(policy)s, %(now)s)
on conflict (policy) do nothing;

-- name: schedule_list
-- Every schedule's state.
select policy, paused, paused_by, last_fire_at, updated_at from expiry.schedules order by policy;

-- name: schedule_advance
-- Claim the fire times after %(last)s, up to %(fire)s: a compare-and-set on the
-- last_fire_at this scheduler read, so any number of schedulers open exactly one
-- run per fire (one that read a stale value claims nothing and reads again).
update expiry.schedules set last_fire_at = %(fire)s, updated_at = now()
where policy = %(policy)s and not paused
  and last_fire_at = %(last)s::timestamptz and last_fire_at < %(fire)s
returning policy;

-- name: schedule_set_paused
-- Pause or resume a policy's schedule, saying who paused it (the throttle's
-- stop holds the policy's windows too).
insert into expiry.schedules (policy, paused, paused_by, last_fire_at)
values (%(policy)s, %(paused)s, %(by)s, now())
on conflict (policy) do update
set paused = excluded.paused, paused_by = excluded.paused_by, updated_at = now()
returning policy;

-- name: schedule_version
-- Changes by other processes (pause/resume, cron targets created, deleted,
-- paused or fired) show up here.
select greatest(
           coalesce((select max(updated_at) from expiry.schedules), 'epoch'::timestamptz),
           coalesce((select max(updated_at) from expiry.cron_targets), 'epoch'::timestamptz)
       ) as version,
       (select count(*) from expiry.schedules) + (select count(*) from expiry.cron_targets) as n;

-- name: key_insert
-- Store a new API key's hash (the secret itself is never stored).
insert into expiry.api_keys (name, hash, scopes) values (%(name)s, %(hash)s, %(scopes)s::jsonb)
on conflict (name) do nothing returning name;

-- name: key_list
-- Every API key, without secrets.
select name, scopes, created_at, revoked_at from expiry.api_keys order by name;

-- name: key_revoke
-- Revoke a key; it stops working at once.
update expiry.api_keys set revoked_at = now() where name = %(name)s and revoked_at is null
returning name;

-- name: key_set_scopes
-- Replace the scopes of a key in force.
update expiry.api_keys set scopes = %(scopes)s::jsonb
where name = %(name)s and revoked_at is null returning name;

-- name: key_active
-- Hashes of every key still in force.
select name, hash, scopes from expiry.api_keys where revoked_at is null;

-- name: idempotency_begin
-- Record that a request with this key is in flight; no row back means it exists.
insert into expiry.idempotency (api_key, key, request_hash) values (%(api_key)s, %(key)s, %(hash)s)
on conflict (api_key, key) do nothing returning key;

-- name: idempotency_get
-- A stored request: its body hash and, once finished, its response.
select request_hash, status, body from expiry.idempotency
where api_key = %(api_key)s and key = %(key)s and created_at > now() - interval '24 hours';

-- name: idempotency_finish
-- Store the first response for replay.
update expiry.idempotency set status = %(status)s, body = %(body)s
where api_key = %(api_key)s and key = %(key)s;

-- name: idempotency_forget
-- Drop an in-flight record whose request failed before answering, or one expired.
delete from expiry.idempotency
where (api_key = %(api_key)s and key = %(key)s) or created_at < now() - interval '24 hours';

-- name: cron_insert
-- Create a cron target; the name is unique.
insert into expiry.cron_targets (name, http_url, schedule, timezone, secret, owner, last_fire_at)
values (%(name)s, %(http_url)s, %(schedule)s, %(timezone)s, %(secret)s, %(owner)s, now())
on conflict (name) do nothing returning name;

-- name: cron_list
-- Every cron target.
select * from expiry.cron_targets order by name;

-- name: cron_get
-- One cron target.
select * from expiry.cron_targets where name = %(name)s;

-- name: cron_delete
-- Delete a cron target (its call history stays).
delete from expiry.cron_targets where name = %(name)s returning name;

-- name: cron_set_paused
-- Pause or resume a cron target.
update expiry.cron_targets set paused = %(paused)s, updated_at = now() where name = %(name)s
returning name;

-- name: cron_update
-- Point a cron target at another URL, schedule or time zone (its fires so far stay).
update expiry.cron_targets
set http_url = %(http_url)s, schedule = %(schedule)s, timezone = %(timezone)s, updated_at = now()
where name = %(name)s
returning name;

-- name: cron_advance
-- Claim a cron target's fire time: compare-and-set on the last_fire_at the
-- scheduler read, as for policies.
update expiry.cron_targets set last_fire_at = %(fire)s, updated_at = now()
where name = %(name)s and not paused
  and last_fire_at = %(last)s::timestamptz and last_fire_at < %(fire)s
returning name;

-- name: cron_call_insert
-- Record one call's outcome.
insert into expiry.cron_calls (name, fire_time, attempt, status, duration_ms, response, error)
values (%(name)s, %(fire_time)s, %(attempt)s, %(status)s, %(duration_ms)s, %(response)s, %(error)s);

-- name: cron_calls
-- A cron target's newest calls.
select * from expiry.cron_calls where name = %(name)s order by id desc limit %(limit)s;

-- name: audit_counts
-- Audited events by action and policy, for metrics.
select action, policy, count(*) as n from expiry.audit group by action, policy;

-- name: worker_seen
-- A worker process's roll call at each heartbeat: who it is, what it works,
-- how many jobs it holds and which queues rest.
insert into expiry.workers (name, host, pid, threads, queues, resting, holding, health)
values (%(name)s, %(host)s, %(pid)s, %(threads)s, %(queues)s::jsonb, %(resting)s::jsonb,
        %(holding)s, %(health)s::jsonb)
on conflict (name) do update
set threads = excluded.threads, queues = excluded.queues, resting = excluded.resting,
    holding = excluded.holding, health = excluded.health, seen_at = now();

-- name: worker_forget
-- Workers not seen for a day are forgotten (killed without a word).
delete from expiry.workers where seen_at < now() - interval '1 day';

-- name: worker_gone
-- A worker that stopped cleanly leaves the roll.
delete from expiry.workers where name = %(name)s;

-- name: worker_list
-- The roll, newest first, with how long ago each was seen (the database's clock).
select name, host, pid, threads, queues, resting, holding, health, started_at, seen_at,
       extract(epoch from now() - seen_at)::float8 as seen_seconds_ago
from expiry.workers order by started_at desc, name;

-- name: lock_holders
-- The other sessions holding a lock on a table (a window's lock wait waited
-- behind one of them), oldest transaction first.
select a.pid, coalesce(a.application_name, '') as application, coalesce(a.state, '') as state,
       extract(epoch from now() - a.xact_start)::float8 as seconds,
       left(coalesce(a.query, ''), 200) as query
from pg_stat_activity a
where a.pid <> pg_backend_pid()
  and a.pid in (select l.pid from pg_locks l
                where l.locktype = 'relation' and l.relation = to_regclass(%(table)s) and l.granted)
order by a.xact_start nulls last, a.pid
limit 5;
