-- 0013: TRUNCATE expiry.jobs (an operator emptying the queue by hand) empties
-- expiry.job_keys with it. Otherwise the keys of the jobs it removed stayed
-- taken, and a job enqueued again under one of them (a window of a run opened
-- again at the same cutoff) was skipped as a duplicate of a job that no longer
-- exists: lost without a word. prune frees the keys of the jobs it deletes;
-- this trigger covers the one bulk removal that fires no row trigger. It costs
-- the queue's statements nothing. A TRUNCATE that names expiry.job_keys too
-- holds it open, so that a second TRUNCATE of it fails (object in use): then
-- a DELETE of what is left (nothing, by then) does.

create function expiry.job_keys_truncate() returns trigger
language plpgsql as $$
begin
    begin
        truncate expiry.job_keys;
    exception when object_in_use then
        delete from expiry.job_keys;
    end;
    return null;
end
$$;

create trigger jobs_truncate_frees_keys
    after truncate on expiry.jobs
    for each statement execute function expiry.job_keys_truncate();
