-- 0016: each policy's state once a minute.
--
-- The dashboard's history (backlog, retries, dead letters, the oldest expired
-- row's age, the throttle's hold) was a sample in one process's memory, taken
-- when a page was shown and lost with the process. Workers and the scheduler
-- now sample each policy once a minute into this table, the first sample of a
-- minute kept whichever process takes it; samples older than a week are pruned.
create table expiry.samples (
    policy     text             not null,
    minute     timestamptz      not null,
    backlog    bigint           not null,
    retrying   bigint           not null,
    dead       bigint           not null,
    oldest_age double precision,
    held       text,
    primary key (policy, minute)
);
create index samples_minute on expiry.samples (minute);
