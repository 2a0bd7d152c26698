-- 0008: expiry's own jobs in queues of their own, runs that can be cancelled,
-- and the workers' roll call (postgres/migrations/0008 says why).

update expiry_jobs set queue = 'expiry.policy.' || json_extract(payload, '$.policy')
where queue = 'default'
  and handler in ('expiry.plan', 'expiry.window', 'expiry.partition')
  and json_extract(payload, '$.policy') is not null;
update expiry_jobs set queue = 'expiry.cron'
where queue = 'default' and handler = 'expiry.http_call';

alter table expiry_runs add column cancelled_at real;
alter table expiry_runs add column cancelled_by text;

create table expiry_workers (
    name        text    primary key,
    host        text    not null,
    pid         integer not null,
    threads     integer not null,
    queues      text    not null,  -- a JSON array
    started_at  real    not null,
    seen_at     real    not null,
    resting     text    not null default '{}',
    holding     integer not null default 0
);
