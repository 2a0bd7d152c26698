-- 0017: a cron target's own call timeout (postgres/migrations/0017 says why).
alter table expiry_cron_targets add column timeout_seconds double;
