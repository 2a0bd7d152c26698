-- 0010: each worker's throttle on the roll: per policy its state (open, held,
-- critical, paused), the reason, the rate limit, the seconds held by reason
-- and the last readings (health.py's snapshot), for status, the dashboard and
-- /metrics.
alter table expiry.workers add column health jsonb not null default '{}';
