-- PostgreSQL's named queries for the queue: jobs inserted, claimed, leased, completed, retried, dead-lettered, pruned.

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
