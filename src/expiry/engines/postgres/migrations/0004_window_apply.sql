-- 0004: a window's delete and its bookkeeping in one statement, so that the
-- window's transaction is one round trip: BEGIN, the limits and turn
-- (target.py's WINDOW_START), this function, COMMIT, sent together.
--
-- The delete (or move) comes as text from target.py, where its identifiers are
-- quoted; its values are bound here ($1 lo, $2 hi, $3 cutoff, $4 the job key of
-- the ledger guard). Its row count comes from GET DIAGNOSTICS: a RETURNING to
-- count the rows would project and keep every row it took.
--
-- Returns the rows taken, or null when the key was booked before: a duplicate
-- delivery, audited, which changed nothing. Raises, so that the transaction
-- rolls back with whatever the delete took:
--   * unique_violation on ledger_pkey when rows were taken but another delivery
--     booked the key meanwhile (the engine raises AlreadyApplied);
--   * EX001 when the job is given and its lease has moved on (LeaseLost).

create function expiry.window_apply(
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
    execute statement using lo, hi, cutoff, key;
    get diagnostics taken = row_count;

    if job_id is not null then
        -- As queries/jobs.sql's job_complete: only while the lease is still held.
        update expiry.jobs j
        set state = 'completed', finished_at = now(), updated_at = now(),
            lease_owner = null, lease_token = null, lease_expires_at = null
        where j.id = job_id and j.lease_token = window_apply.lease_token
          and j.state = 'running' and j.lease_expires_at > now();
        if not found then
            raise exception 'job %: lease lost before completion', key using errcode = 'EX001';
        end if;
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
