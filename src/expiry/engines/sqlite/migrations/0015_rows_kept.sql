-- 0015: the rows a window kept, counted (postgres/migrations/0015 says why).
alter table expiry_ledger add column rows_kept integer not null default 0;
update expiry_ledger set rows_kept = 1 where blocked is not null;
