-- 0001: the job queue, the ledger, runs and the audit log.
-- MySQL has no schemas within a database: expiry's tables share the
-- application's database and are prefixed expiry_, as on SQLite. InnoDB, times
-- are DATETIME(6) in UTC from the server's clock (UTC_TIMESTAMP(6)), text is
-- utf8mb4 with a binary collation: keys and names compare exactly, as on the
-- other engines ('A' and 'a' are two keys). DDL commits on its own in MySQL: a
-- migration run again after a crash part-way skips what it created already
-- (tables if not exists; engine.py passes over a column or index that exists).
-- MySQL has no partial indexes: the claim index is over a stored column that
-- holds the queue only while the job waits, so it stays small however many
-- completed jobs the table holds.

create table if not exists expiry_jobs (
    id               bigint       not null auto_increment primary key,
    queue            varchar(255) not null,
    handler          varchar(255) not null,
    `key`            varchar(700) not null,
    payload          longtext     not null,
    state            varchar(16)  not null default 'available',
    priority         smallint     not null default 0,
    attempt          integer      not null default 0,
    max_attempts     integer      not null default 8,
    run_at           datetime(6)  not null,
    run_id           varchar(700),
    lease_owner      varchar(255),
    lease_token      varchar(64),
    lease_expires_at datetime(6),
    last_error       text,
    last_error_kind  varchar(255),
    errors           longtext     not null,
    created_at       datetime(6)  not null,
    attempted_at     datetime(6),
    finished_at      datetime(6),
    updated_at       datetime(6)  not null,
    due_queue        varchar(255) as (case when state in ('scheduled', 'available', 'retryable')
                                          then queue end) stored,
    constraint expiry_jobs_key unique (`key`),
    constraint expiry_jobs_state check (state in ('scheduled', 'available', 'running',
                                                  'retryable', 'completed', 'dead', 'cancelled')),
    constraint expiry_jobs_attempts check (max_attempts > 0),
    index expiry_jobs_due (due_queue, priority, run_at, id),
    index expiry_jobs_running (state, lease_expires_at),
    index expiry_jobs_finished (state, finished_at),
    index expiry_jobs_run (run_id, state)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;

create table if not exists expiry_ledger (
    `key`         varchar(700) not null primary key,
    policy        varchar(255),
    run_id        varchar(700),
    lo            bigint,
    hi            bigint,
    action        varchar(32),
    rows_affected bigint       not null default 0,
    worker        varchar(255),
    applied_at    datetime(6)  not null,
    index expiry_ledger_run (run_id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;

create table if not exists expiry_runs (
    id              varchar(700) not null primary key,
    policy          varchar(255) not null,
    cutoff          datetime(6)  not null,
    opened_by       varchar(255) not null,
    state           varchar(16)  not null default 'planning',
    windows_planned integer      not null default 0,
    opened_at       datetime(6)  not null,
    planned_at      datetime(6),
    finished_at     datetime(6),
    constraint expiry_runs_state check (state in ('planning', 'running', 'finished')),
    index expiry_runs_policy (policy, opened_at)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;

create table if not exists expiry_audit (
    id       bigint       not null auto_increment primary key,
    at       datetime(6)  not null,
    actor    varchar(255) not null,
    action   varchar(64)  not null,
    policy   varchar(255),
    run_id   varchar(700),
    job_key  varchar(700),
    detail   longtext     not null,
    index expiry_audit_at (at)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;

drop trigger if exists expiry_audit_no_update;
create trigger expiry_audit_no_update before update on expiry_audit for each row
    signal sqlstate '45000' set message_text = 'expiry_audit is append-only';
drop trigger if exists expiry_audit_no_delete;
create trigger expiry_audit_no_delete before delete on expiry_audit for each row
    signal sqlstate '45000' set message_text = 'expiry_audit is append-only';
