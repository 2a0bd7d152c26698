-- 0012: a job's key is unique in expiry.job_keys, a table whose rows are
-- written once (at enqueue) and deleted once (when the job is pruned), not in
-- a unique index on expiry.jobs. A job's row is rewritten at every claim,
-- completion and retry, and no such update can be HOT (each changes the state
-- that the queue's partial indexes select on): every rewrite inserted a new
-- entry into jobs_key_unique and checked it against the key's older versions.
-- Measured on the queue bench (50,000 jobs, one worker), that index cost the
-- server about a third of its CPU per job.
--
-- The rule is the same: one job per key, from enqueue until the job is pruned;
-- a key seen again meanwhile is skipped. job_keys.job_id names the job's row,
-- so that a lookup by key (job_get, redrive, discard) stays an index probe.

create table expiry.job_keys (
    key    text   primary key,
    job_id bigint not null
);

insert into expiry.job_keys (key, job_id) select key, id from expiry.jobs;

alter table expiry.jobs drop constraint jobs_key_unique;
