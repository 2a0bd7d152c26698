-- 0015: the rows a window kept, counted.
--
-- A window whose delete a foreign key refuses (ON DELETE RESTRICT or NO
-- ACTION) is applied again at once without the rows other tables reference:
-- those are kept, and the window's ledger row counts them (rows_kept) beside
-- the reason (blocked), in the same transaction as its delete. A window split
-- down to one referenced row, as before, keeps that one row.
alter table expiry.ledger add column rows_kept bigint not null default 0;
update expiry.ledger set rows_kept = 1 where blocked is not null;
