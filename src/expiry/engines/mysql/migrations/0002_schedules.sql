-- 0002: the scheduler's durable state per policy.

create table if not exists expiry_schedules (
    policy       varchar(255) not null primary key,
    paused       boolean      not null default false,
    last_fire_at datetime(6),
    updated_at   datetime(6)  not null
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;
