-- 0007: windows over any key. The ledger records a window bounded by
-- (timestamp, key) positions as text (bounds), and a row that a foreign key
-- kept a window from deleting, with the reason (blocked). SQLite's window runs
-- as statements in the worker's transaction (engines/sqlite/tables.py): no
-- function to change.

alter table expiry_ledger add column bounds text;
alter table expiry_ledger add column blocked text;
