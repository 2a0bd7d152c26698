-- 0001: the job queue, the ledger, runs and the audit log.
-- SQLite has no schemas: expiry's tables share the application's file and are
-- prefixed expiry_. Times are REAL seconds since the epoch, from SQLite's clock.

create table expiry_jobs (
    id               integer primary key,
    queue            text    not null,
    handler          text    not null,
    key              text    not null unique,
    payload          text    not null default '{}',
    state            text    not null default 'available'
                     check (state in ('scheduled', 'available', 'running', 'retryable',
                                      'completed', 'dead', 'cancelled')),
    priority         integer not null default 0,
    attempt          integer not null default 0,
    max_attempts     integer not null default 8 check (max_attempts > 0),
    run_at           real    not null,
    run_id           text,
    lease_owner      text,
    lease_token      text,
    lease_expires_at real,
    last_error       text,
    last_error_kind  text,
    errors           text    not null default '[]',
    created_at       real    not null,
    attempted_at     real,
    finished_at      real,
    updated_at       real    not null
);

create index expiry_jobs_due on expiry_jobs (queue, priority, run_at, id)
    where state in ('scheduled', 'available', 'retryable');
create index expiry_jobs_running on expiry_jobs (lease_expires_at) where state = 'running';
create index expiry_jobs_finished on expiry_jobs (finished_at) where state in ('completed', 'cancelled');
create index expiry_jobs_dead on expiry_jobs (finished_at) where state = 'dead';
create index expiry_jobs_run on expiry_jobs (run_id, state) where run_id is not null;

create table expiry_ledger (
    key           text    primary key,
    policy        text,
    run_id        text,
    lo            integer,
    hi            integer,
    action        text,
    rows_affected integer not null default 0,
    worker        text,
    applied_at    real    not null
);
create index expiry_ledger_run on expiry_ledger (run_id) where run_id is not null;

create table expiry_runs (
    id              text    primary key,
    policy          text    not null,
    cutoff          real    not null,
    opened_by       text    not null,
    state           text    not null default 'planning'
                    check (state in ('planning', 'running', 'finished')),
    windows_planned integer not null default 0,
    opened_at       real    not null,
    planned_at      real,
    finished_at     real
);
create index expiry_runs_policy on expiry_runs (policy, opened_at desc);

create table expiry_audit (
    id       integer primary key,
    at       real    not null,
    actor    text    not null,
    action   text    not null,
    policy   text,
    run_id   text,
    job_key  text,
    detail   text    not null default '{}'
);
create index expiry_audit_at on expiry_audit (at);

create trigger expiry_audit_no_update before update on expiry_audit
begin select raise(abort, 'expiry_audit is append-only'); end;
create trigger expiry_audit_no_delete before delete on expiry_audit
begin select raise(abort, 'expiry_audit is append-only'); end;
