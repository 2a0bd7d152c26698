-- 0002: the scheduler's durable state per policy.

create table expiry_schedules (
    policy       text    primary key,
    paused       integer not null default 0,
    last_fire_at real,
    updated_at   real    not null
);
