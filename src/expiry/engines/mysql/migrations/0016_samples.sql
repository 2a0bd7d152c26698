-- 0016: each policy's state once a minute (postgres/migrations/0016 says why).
create table if not exists expiry_samples (
    policy     varchar(255) not null,
    minute     datetime(6)  not null,
    backlog    bigint       not null,
    retrying   bigint       not null,
    dead       bigint       not null,
    oldest_age double,
    held       varchar(255),
    primary key (policy, minute),
    index expiry_samples_minute (minute)
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;
