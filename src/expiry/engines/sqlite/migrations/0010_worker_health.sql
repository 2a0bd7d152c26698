-- 0010: each worker's throttle on the roll (postgres/migrations/0010 says why).
alter table expiry_workers add column health text not null default '{}';
alter table expiry_schedules add column paused_by text;
