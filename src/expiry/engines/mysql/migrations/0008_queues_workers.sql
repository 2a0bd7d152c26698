-- 0008: expiry's own jobs in queues of their own, runs that can be cancelled,
-- and the workers' roll call (postgres/migrations/0008 says why).

update expiry_jobs
set queue = concat('expiry.policy.', json_unquote(json_extract(payload, '$.policy')))
where queue = 'default'
  and handler in ('expiry.plan', 'expiry.window', 'expiry.partition')
  and json_extract(payload, '$.policy') is not null;
update expiry_jobs set queue = 'expiry.cron'
where queue = 'default' and handler = 'expiry.http_call';

alter table expiry_runs add column cancelled_at datetime(6),
                        add column cancelled_by varchar(255);

create table if not exists expiry_workers (
    name        varchar(255) not null primary key,
    host        varchar(255) not null,
    pid         integer      not null,
    threads     integer      not null,
    queues      longtext     not null,
    started_at  datetime(6)  not null,
    seen_at     datetime(6)  not null,
    resting     longtext     not null,
    holding     integer      not null default 0
) engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin;
