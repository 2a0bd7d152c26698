-- MySQL/MariaDB's named queries for a policy's runs: opened, planned, turned, finished, read back, and their totals.
-- (This engine's conventions are at the top of database.sql.)

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
-- (postgres/queries/ says what each means).
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
