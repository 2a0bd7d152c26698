-- MySQL/MariaDB's named queries for schedules and cron over HTTP: each policy's schedule, cron targets and their calls.
-- (This engine's conventions are at the top of database.sql.)

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

-- name: cron_insert
-- Create a cron target; the name is unique.
insert into expiry_cron_targets (name, http_url, schedule, timezone, secret, owner,
                                 timeout_seconds, last_fire_at, created_at, updated_at)
values (%(name)s, %(http_url)s, %(schedule)s, %(timezone)s, %(secret)s, %(owner)s, %(timeout)s,
        $now, $now, $now);
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
-- Point a cron target at another URL, schedule, time zone or call timeout (its
-- fires so far stay).
update expiry_cron_targets
set http_url = %(http_url)s, schedule = %(schedule)s, timezone = %(timezone)s,
    timeout_seconds = %(timeout)s, updated_at = $now
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
