-- 0008: expiry's own jobs in queues of their own, runs that can be cancelled,
-- and the workers' roll call.
--
-- A policy's planning, partition and window jobs wait in its own queue,
-- expiry.policy.<name>, and cron calls in expiry.cron, no longer in 'default'
-- among the application's jobs: a worker holds back a resting policy by not
-- claiming from its queue, and its threads take the policies' queues in turn.
-- Jobs already queued move; names starting with 'expiry.' are reserved.
update expiry.jobs set queue = 'expiry.policy.' || (payload->>'policy')
where queue = 'default'
  and handler in ('expiry.plan', 'expiry.window', 'expiry.partition')
  and payload ? 'policy';
update expiry.jobs set queue = 'expiry.cron'
where queue = 'default' and handler = 'expiry.http_call';

-- A cancelled run is finished: its waiting jobs were cancelled, and it says
-- who cancelled it and when.
alter table expiry.runs add column cancelled_at timestamptz, add column cancelled_by text;

-- Each running worker process, seen at every heartbeat: what the workers
-- view shows beside the jobs each one holds (jobs.lease_owner = name).
create table expiry.workers (
    name        text        primary key,
    host        text        not null,
    pid         integer     not null,
    threads     integer     not null,
    queues      jsonb       not null,
    started_at  timestamptz not null default now(),
    seen_at     timestamptz not null default now(),
    resting     jsonb       not null default '{}',
    holding     integer     not null default 0
);
