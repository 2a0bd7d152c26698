-- 0010: each worker's throttle on the roll: per policy its state (open, held,
-- critical, paused), the reason, the rate limit, the seconds held by reason
-- and the last readings (health.py's snapshot), for status, the dashboard and
-- /metrics.
alter table expiry.workers add column health jsonb not null default '{}';

-- A schedule paused by the throttle's critical reading says so: its policy's
-- windows wait (in every process) until an operator resumes it. A pause by an
-- operator stops the schedule only, as before: open runs finish.
alter table expiry.schedules add column paused_by text;
