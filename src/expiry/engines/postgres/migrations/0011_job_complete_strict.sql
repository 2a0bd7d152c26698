-- 0011: expiry.job_complete_strict, the completion rule of expiry.job_complete
-- that raises EX001 (LeaseLost) instead of returning null, so that a job's
-- transaction can send its completion and its COMMIT together, in one round
-- trip: when the lease has moved on, the error aborts the transaction and the
-- COMMIT behind it rolls back, and nothing of the handler's effect commits.

create function expiry.job_complete_strict(job_id bigint, token text) returns bigint
language plpgsql as $$
declare
    done bigint;
begin
    done := expiry.job_complete(job_id, token);
    if done is null then
        raise exception 'job %: lease lost before completion', job_id using errcode = 'EX001';
    end if;
    return done;
end
$$;
