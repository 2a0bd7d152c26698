-- PostgreSQL's named queries for schedules and cron over HTTP: each policy's schedule, cron targets and their calls.

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

-- name: cron_insert
-- Create a cron target; the name is unique.
insert into expiry.cron_targets
    (name, http_url, schedule, timezone, secret, owner, timeout_seconds, last_fire_at)
values (%(name)s, %(http_url)s, %(schedule)s, %(timezone)s, %(secret)s, %(owner)s, %(timeout)s, now())
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
-- Point a cron target at another URL, schedule, time zone or call timeout (its
-- fires so far stay).
update expiry.cron_targets
set http_url = %(http_url)s, schedule = %(schedule)s, timezone = %(timezone)s,
    timeout_seconds = %(timeout)s, updated_at = now()
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
