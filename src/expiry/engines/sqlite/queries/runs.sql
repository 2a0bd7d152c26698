-- SQLite's named queries for a policy's runs: opened, planned, turned, finished, read back, and their totals.
-- (This engine's conventions are at the top of database.sql.)

-- name: run_prune
-- Delete, a bounded batch at a time, the runs finished longer ago than the
-- given age that have no ledger row left.
delete from expiry_runs where id in (
    select r.id from expiry_runs r
    where r.state = 'finished' and r.finished_at < $now - :age
      and not exists (select 1 from expiry_ledger l where l.run_id = r.id)
    limit :limit
);

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
-- (postgres/queries/ says what each means).
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
