-- 0007: windows over any key. A window is bounded either by two integer keys
-- (lo, hi] or, for tables whose key is text, a UUID, part of a composite key or
-- sparse, by two (timestamp, key) positions in the timestamp's order: the
-- window's statement reads those as $5 (text[]: lower timestamp, lower key,
-- upper timestamp, upper key), cast to the columns' types in the statement.
-- The ledger records such a window's range as text (bounds), and a window that
-- a foreign key keeps from deleting a row records the row and the reason
-- (blocked). Partitions dropped or detached are booked with their name in
-- bounds.

alter table expiry.ledger add column bounds text, add column blocked text;

drop function expiry.window_apply(
    text, bigint, bigint, timestamptz, text, text, text, text, text, bigint, text);

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
    lease_token text,
    positions   text[],
    bounds      text
) returns bigint
language plpgsql as $$
declare
    taken bigint;
begin
    -- Deliveries of one window take turns (bounded by the session's
    -- lock_timeout): the delete below, a statement of its own with its own
    -- snapshot, then sees an earlier delivery's ledger row and takes nothing.
    perform pg_advisory_xact_lock(hashtextextended(key, 0));
    execute statement using lo, hi, cutoff, key, positions;
    get diagnostics taken = row_count;

    if job_id is not null and expiry.job_complete(job_id, lease_token) is null then
        raise exception 'job %: lease lost before completion', key using errcode = 'EX001';
    end if;

    if taken > 0 then
        -- This delivery must own the key: a conflict fails the transaction.
        insert into expiry.ledger
            (key, policy, run_id, lo, hi, bounds, action, worker, rows_affected)
        values (window_apply.key, policy, run_id, lo, hi, bounds, action, worker, taken);
        return taken;
    end if;
    insert into expiry.ledger (key, policy, run_id, lo, hi, bounds, action, worker, rows_affected)
    values (window_apply.key, policy, run_id, lo, hi, bounds, action, worker, 0)
    on conflict on constraint ledger_pkey do nothing;
    if found then
        return 0;
    end if;
    insert into expiry.audit (actor, action, policy, run_id, job_key)
    values (coalesce(worker, 'worker'), 'window.duplicate', policy, run_id, window_apply.key);
    return null;
end
$$;
