-- 0016: each policy's state once a minute (postgres/migrations/0016 says why).
create table expiry_samples (
    policy     text    not null,
    minute     real    not null,
    backlog    integer not null,
    retrying   integer not null,
    dead       integer not null,
    oldest_age real,
    held       text,
    primary key (policy, minute)
);
create index expiry_samples_minute on expiry_samples (minute);
