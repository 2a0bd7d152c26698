-- 0002: the scheduler's durable state per policy.

create table expiry.schedules (
    policy       text        primary key,
    paused       boolean     not null default false,
    last_fire_at timestamptz,
    updated_at   timestamptz not null default now()
);
