CREATE INDEX expiry_audit_at on expiry_audit (at);

CREATE INDEX expiry_audit_run on expiry_audit (run_id);

CREATE INDEX expiry_cron_calls_name on expiry_cron_calls (name, id desc);

CREATE INDEX expiry_idempotency_created on expiry_idempotency (created_at);

CREATE INDEX expiry_jobs_dead on expiry_jobs (finished_at) where state = 'dead';

CREATE INDEX expiry_jobs_due on expiry_jobs (queue, priority, run_at, id)
    where state in ('scheduled', 'available', 'retryable');

CREATE INDEX expiry_jobs_finished on expiry_jobs (finished_at) where state in ('completed', 'cancelled');

CREATE INDEX expiry_jobs_run on expiry_jobs (run_id, state) where run_id is not null;

CREATE INDEX expiry_jobs_running on expiry_jobs (lease_expires_at) where state = 'running';

CREATE INDEX expiry_ledger_run on expiry_ledger (run_id) where run_id is not null;

CREATE INDEX expiry_runs_open on expiry_runs (policy, opened_at) where state <> 'finished';

CREATE INDEX expiry_runs_policy on expiry_runs (policy, opened_at desc);

CREATE INDEX expiry_samples_minute on expiry_samples (minute);

CREATE TABLE expiry_api_keys (
    name       text primary key,
    hash       text not null,
    created_at real not null,
    revoked_at real
, scopes text not null default '["admin"]');

CREATE TABLE expiry_audit (
    id       integer primary key,
    at       real    not null,
    actor    text    not null,
    action   text    not null,
    policy   text,
    run_id   text,
    job_key  text,
    detail   text    not null default '{}'
);

CREATE TABLE expiry_cron_calls (
    id          integer primary key,
    name        text    not null,
    fire_time   real    not null,
    attempt     integer not null,
    status      integer,
    duration_ms real,
    response    text,
    error       text,
    at          real    not null
);

CREATE TABLE expiry_cron_targets (
    name         text    primary key,
    http_url     text    not null,
    schedule     text    not null,
    timezone     text    not null default 'UTC',
    secret       text    not null,
    paused       integer not null default 0,
    last_fire_at real,
    created_at   real    not null,
    updated_at   real    not null
, owner text, timeout_seconds real);

CREATE TABLE expiry_idempotency (
    api_key      text    not null,
    key          text    not null,
    request_hash text    not null,
    status       integer,
    body         text,
    created_at   real    not null,
    primary key (api_key, key)
);

CREATE TABLE expiry_jobs (
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
, wait_reason text, waiting_since real, unspent_since real);

CREATE TABLE expiry_ledger (
    key           text    primary key,
    policy        text,
    run_id        text,
    lo            integer,
    hi            integer,
    action        text,
    rows_affected integer not null default 0,
    worker        text,
    applied_at    real    not null
, bounds text, blocked text, rows_kept integer not null default 0);

CREATE TABLE expiry_runs (
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
, cancelled_at real, cancelled_by text, superseded_by text, stalled_at real);

CREATE TABLE expiry_samples (
    policy     text    not null,
    minute     real    not null,
    backlog    integer not null,
    retrying   integer not null,
    dead       integer not null,
    oldest_age real,
    held       text,
    primary key (policy, minute)
);

CREATE TABLE expiry_schedules (
    policy       text    primary key,
    paused       integer not null default 0,
    last_fire_at real,
    updated_at   real    not null
, paused_by text);

CREATE TABLE expiry_schema_migrations ( version integer primary key, applied_at real not null);

CREATE TABLE expiry_workers (
    name        text    primary key,
    host        text    not null,
    pid         integer not null,
    threads     integer not null,
    queues      text    not null,  -- a JSON array
    started_at  real    not null,
    seen_at     real    not null,
    resting     text    not null default '{}',
    holding     integer not null default 0
, health text not null default '{}');

CREATE TRIGGER expiry_audit_no_delete before delete on expiry_audit
begin select raise(abort, 'expiry_audit is append-only'); end;

CREATE TRIGGER expiry_audit_no_update before update on expiry_audit
begin select raise(abort, 'expiry_audit is append-only'); end;

