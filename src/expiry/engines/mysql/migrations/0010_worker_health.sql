-- 0010: each worker's throttle on the roll (postgres/migrations/0010 says why).
alter table expiry_workers add column health longtext;
alter table expiry_schedules add column paused_by varchar(255);
update expiry_workers set health = '{}' where health is null;
