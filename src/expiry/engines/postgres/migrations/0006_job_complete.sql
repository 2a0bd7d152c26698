-- 0006: the job-completion rule written once. expiry.job_complete completes a
-- job only while the caller still holds its unexpired lease, and returns its id
-- (null when the lease moved on). queries/jobs.sql's job_complete calls it, and so
-- does expiry.window_apply, which repeated the rule until now. plpgsql, so that
-- its statement is planned once per session (a LANGUAGE sql function with an
-- UPDATE is planned at every call). Group commit's job_complete_many keeps its
-- set-based statement of the same rule, for speed: one UPDATE for many jobs.

create function expiry.job_complete(job_id bigint, token text) returns bigint
language plpgsql as $$
declare
    done bigint;
begin
    update expiry.jobs j
    set state = 'completed', finished_at = now(), updated_at = now(),
        lease_owner = null, lease_token = null, lease_expires_at = null
    where j.id = job_id and j.lease_token = token and j.state = 'running'
      and j.lease_expires_at > now()
    returning j.id into done;
    return done;
end
$$;

create or replace function expiry.window_apply(
    statement   text,
    lo          bigint,
    hi          bigint,
    cutoff      timestamptz,
    key         text,
    policy      text,
    run_id      text,
    action      text,
    worker      text,
    job_id      bigint,
    lease_token text
) returns bigint
language plpgsql as $$
declare
    taken bigint;
begin
    -- Deliveries of one window take turns (bounded by the session's
    -- lock_timeout): the delete below, a statement of its own with its own
    -- snapshot, then sees an earlier delivery's ledger row and takes nothing.
    perform pg_advisory_xact_lock(hashtextextended(key, 0));
    execute statement using lo, hi, cutoff, key;
    get diagnostics taken = row_count;

    if job_id is not null and expiry.job_complete(job_id, lease_token) is null then
        raise exception 'job %: lease lost before completion', key using errcode = 'EX001';
    end if;

    if taken > 0 then
        -- This delivery must own the key: a conflict fails the transaction.
        insert into expiry.ledger (key, policy, run_id, lo, hi, action, worker, rows_affected)
        values (window_apply.key, policy, run_id, lo, hi, action, worker, taken);
        return taken;
    end if;
    insert into expiry.ledger (key, policy, run_id, lo, hi, action, worker, rows_affected)
    values (window_apply.key, policy, run_id, lo, hi, action, worker, 0)
    on conflict on constraint ledger_pkey do nothing;
    if found then
        return 0;
    end if;
    insert into expiry.audit (actor, action, policy, run_id, job_key)
    values (coalesce(worker, 'worker'), 'window.duplicate', policy, run_id, window_apply.key);
    return null;
end
$$;
