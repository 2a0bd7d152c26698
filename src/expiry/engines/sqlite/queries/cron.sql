-- SQLite's named queries for schedules and cron over HTTP: each policy's schedule, cron targets and their calls.
-- (This engine's conventions are at the top of database.sql.)

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

-- name: cron_insert
-- Create a cron target; the name is unique.
insert into expiry_cron_targets (name, http_url, schedule, timezone, secret, owner,
                                 timeout_seconds, last_fire_at, created_at, updated_at)
values (:name, :http_url, :schedule, :timezone, :secret, :owner, :timeout, $now, $now, $now)
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
-- Point a cron target at another URL, schedule, time zone or call timeout (its
-- fires so far stay).
update expiry_cron_targets
set http_url = :http_url, schedule = :schedule, timezone = :timezone,
    timeout_seconds = :timeout, updated_at = $now
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
