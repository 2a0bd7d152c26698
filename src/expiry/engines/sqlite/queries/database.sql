-- SQLite's named queries for the database itself: its clock and who holds locks on a table.
--
-- The conventions of this engine's queries/*.sql:
-- The same named queries as engines/postgres/queries/, for SQLite.
-- $now is replaced when the file is loaded by SQLite's own clock in epoch
-- seconds: (julianday('now') - 2440587.5) * 86400.0. SQLite has one writer at
-- a time, so claims need no SKIP LOCKED: an IMMEDIATE transaction is enough.

-- name: now
-- The database clock: the only clock expiry trusts.
select $now as now;

-- name: lock_holders
-- SQLite has one writer and no sessions to name: a lock wait there is the
-- database being busy, and nothing more can be said of who holds it.
select 0 as pid, '' as application, '' as state, null as seconds, '' as query
where :table is null;
