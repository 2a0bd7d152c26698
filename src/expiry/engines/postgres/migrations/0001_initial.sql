-- 0001: the job queue, the ledger, runs and the audit log.

create table expiry.jobs (
    id               bigint generated always as identity primary key,
    queue            text        not null,
    handler          text        not null,
    key              text        not null,
    payload          jsonb       not null default '{}',
    state            text        not null default 'available'
                     check (state in ('scheduled', 'available', 'running', 'retryable',
                                      'completed', 'dead', 'cancelled')),
    priority         smallint    not null default 0,
    attempt          integer     not null default 0,
    max_attempts     integer     not null default 8 check (max_attempts > 0),
    run_at           timestamptz not null default now(),
    run_id           text,
    lease_owner      text,
    lease_token      text,
    lease_expires_at timestamptz,
    last_error       text,
    last_error_kind  text,
    errors           jsonb       not null default '[]',
    created_at       timestamptz not null default now(),
    attempted_at     timestamptz,
    finished_at      timestamptz,
    updated_at       timestamptz not null default now(),
    constraint jobs_key_unique unique (key)
) with (
    -- A queue table churns: vacuum it early and without throttling so dead
    -- tuples do not pile up under the due-jobs index.
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Only waiting jobs are in the claim index, so it stays small however many
-- completed jobs the table holds.
create index jobs_due on expiry.jobs (queue, priority, run_at, id)
    where state in ('scheduled', 'available', 'retryable');
create index jobs_running on expiry.jobs (lease_expires_at) where state = 'running';
create index jobs_finished on expiry.jobs (finished_at) where state in ('completed', 'cancelled');
create index jobs_dead on expiry.jobs (finished_at) where state = 'dead';
create index jobs_run on expiry.jobs (run_id, state) where run_id is not null;

create table expiry.ledger (
    key           text        primary key,
    policy        text,
    run_id        text,
    lo            bigint,
    hi            bigint,
    action        text,
    rows_affected bigint      not null default 0,
    worker        text,
    applied_at    timestamptz not null default now()
);
create index ledger_run on expiry.ledger (run_id) where run_id is not null;

create table expiry.runs (
    id              text        primary key,
    policy          text        not null,
    cutoff          timestamptz not null,
    opened_by       text        not null,
    state           text        not null default 'planning'
                    check (state in ('planning', 'running', 'finished')),
    windows_planned integer     not null default 0,
    opened_at       timestamptz not null default now(),
    planned_at      timestamptz,
    finished_at     timestamptz
);
create index runs_policy on expiry.runs (policy, opened_at desc);

create table expiry.audit (
    id       bigint generated always as identity primary key,
    at       timestamptz not null default clock_timestamp(),
    actor    text        not null,
    action   text        not null,
    policy   text,
    run_id   text,
    job_key  text,
    detail   jsonb       not null default '{}'
);
create index audit_at on expiry.audit (at);

create function expiry.audit_is_append_only() returns trigger
language plpgsql as $$
begin
    raise exception 'expiry.audit is append-only';
end $$;

create trigger audit_is_append_only before update or delete on expiry.audit
    for each row execute function expiry.audit_is_append_only();
