-- 0003: the HTTP API's keys and idempotency records, and cron targets over HTTP.

create table expiry.api_keys (
    name       text        primary key,
    hash       text        not null,
    created_at timestamptz not null default now(),
    revoked_at timestamptz
);

create table expiry.idempotency (
    api_key      text        not null,
    key          text        not null,
    request_hash text        not null,
    status       integer,
    body         text,
    created_at   timestamptz not null default now(),
    primary key (api_key, key)
);
create index idempotency_created on expiry.idempotency (created_at);

create table expiry.cron_targets (
    name         text        primary key,
    http_url     text        not null,
    schedule     text        not null,
    timezone     text        not null default 'UTC',
    secret       text        not null,
    paused       boolean     not null default false,
    last_fire_at timestamptz,
    created_at   timestamptz not null default now(),
    updated_at   timestamptz not null default now()
);

create table expiry.cron_calls (
    id          bigint generated always as identity primary key,
    name        text        not null,
    fire_time   timestamptz not null,
    attempt     integer     not null,
    status      integer,
    duration_ms double precision,
    response    text,
    error       text,
    at          timestamptz not null default now()
);
create index cron_calls_name on expiry.cron_calls (name, id desc);
