-- 0014: every wait has a reason and an age; superseded and stalled runs
-- (postgres/migrations/0014 says why).
alter table expiry_jobs add column wait_reason text;
alter table expiry_jobs add column waiting_since datetime(6);
alter table expiry_jobs add column unspent_since datetime(6);
alter table expiry_runs add column superseded_by varchar(700);
alter table expiry_runs add column stalled_at datetime(6);
create index expiry_runs_open on expiry_runs (state, policy, opened_at);
