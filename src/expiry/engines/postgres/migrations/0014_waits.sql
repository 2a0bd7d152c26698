-- 0014: every wait has a reason and an age, and a run that waits too long is seen.
--
-- A job given back without spending an attempt (Snooze: a run waiting for an
-- earlier one, a quarantined policy, a rate limit) says why, and since when it
-- has waited: status, `runs show` and the job page show both. A shutdown's
-- release clears them.
alter table expiry.jobs add column wait_reason text;
alter table expiry.jobs add column waiting_since timestamptz;

-- A failure that is not the job's (a database outage: connection lost,
-- shutdown, read-only after a failover, disk full; a window that timed out,
-- retried with half its rows) spends no attempt for a budget of time, counted
-- from the first of such failures in a row.
alter table expiry.jobs add column unspent_since timestamptz;

-- A run not yet started (its first planning job still waiting) that a later
-- run of its policy covers is finished as superseded by it: the later cutoff
-- deletes every row the earlier one would have. A run open longer than its
-- policy's stall_after is stalled: marked once, audited, alerted on.
alter table expiry.runs add column superseded_by text;
alter table expiry.runs add column stalled_at timestamptz;

-- The open runs, for the stall check and /metrics' oldest open run: a few rows
-- however long the history of finished runs grows.
create index runs_open on expiry.runs (policy, opened_at) where state <> 'finished';
