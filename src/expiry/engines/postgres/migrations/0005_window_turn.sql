-- 0005: a window is one statement. window_apply takes the window's turn lock
-- itself, so that a window needs neither BEGIN nor COMMIT nor a statement of
-- limits before it: on an autocommit session the call is its own transaction,
-- one round trip. Its limits are the session's: lock_timeout and
-- statement_timeout are set on the connection when they differ from the
-- policy's (PostgreSQL arms a statement's timeout as the statement starts, so
-- it cannot be set from inside the function), and client_connection_check_interval
-- when the connection opens. A window cut short by pacing still runs in an
-- explicit transaction, with the job that carries its rest; the lock is
-- re-entrant there.
--
-- Otherwise as 0004: returns the rows taken, or null for a duplicate delivery
-- (audited); raises unique_violation on ledger_pkey (AlreadyApplied) or EX001
-- (LeaseLost), and the transaction rolls back whatever the delete took.

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
