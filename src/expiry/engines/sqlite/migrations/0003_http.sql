-- 0003: the HTTP API's keys and idempotency records, and cron targets over HTTP.

create table expiry_api_keys (
    name       text primary key,
    hash       text not null,
    created_at real not null,
    revoked_at real
);

create table expiry_idempotency (
    api_key      text    not null,
    key          text    not null,
    request_hash text    not null,
    status       integer,
    body         text,
    created_at   real    not null,
    primary key (api_key, key)
);
create index expiry_idempotency_created on expiry_idempotency (created_at);

create table expiry_cron_targets (
    name         text    primary key,
    http_url     text    not null,
    schedule     text    not null,
    timezone     text    not null default 'UTC',
    secret       text    not null,
    paused       integer not null default 0,
    last_fire_at real,
    created_at   real    not null,
    updated_at   real    not null
);

create table expiry_cron_calls (
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
create index expiry_cron_calls_name on expiry_cron_calls (name, id desc);
