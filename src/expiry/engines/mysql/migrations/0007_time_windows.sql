-- 0007: windows over any key. The ledger records a window bounded by
-- (timestamp, key) positions as text (bounds), and a row that a foreign key
-- kept a window from deleting, with the reason (blocked).

alter table expiry_ledger add column bounds text,
                          add column blocked text;
