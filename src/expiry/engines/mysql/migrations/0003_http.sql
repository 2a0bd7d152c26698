-- 0003: the HTTP API's keys and idempotency records, and cron targets over HTTP.

create table if not exists expiry_api_keys (
    name       varchar(255) not null primary key,
    hash       varchar(255) not null,
    created_at datetime(6)  not null,
    revoked_at datetime(6)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;

create table if not exists expiry_idempotency (
    api_key      varchar(255) not null,
    `key`        varchar(255) not null,
    request_hash varchar(255) not null,
    status       integer,
    body         longtext,
    created_at   datetime(6)  not null,
    primary key (api_key, `key`),
    index expiry_idempotency_created (created_at)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;

create table if not exists expiry_cron_targets (
    name         varchar(255)  not null primary key,
    http_url     varchar(2000) not null,
    schedule     varchar(255)  not null,
    timezone     varchar(64)   not null default 'UTC',
    secret       varchar(255)  not null,
    paused       boolean       not null default false,
    last_fire_at datetime(6),
    created_at   datetime(6)   not null,
    updated_at   datetime(6)   not null
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;

create table if not exists expiry_cron_calls (
    id          bigint       not null auto_increment primary key,
    name        varchar(255) not null,
    fire_time   datetime(6)  not null,
    attempt     integer      not null,
    status      integer,
    duration_ms double,
    response    longtext,
    error       text,
    at          datetime(6)  not null,
    index expiry_cron_calls_name (name, id)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;
