-- MySQL/MariaDB's named queries for the database itself: its clock and who holds locks on a table.
--
-- The conventions of this engine's queries/*.sql:
-- The same named queries as engines/postgres/queries/, for MySQL and MariaDB.
-- $now is replaced when the file is loaded by the server's clock in UTC,
-- utc_timestamp(6). MySQL has no UPDATE ... RETURNING: a query that must say
-- which rows it changed is several statements, run in order in one
-- transaction; the rows of the last one that returns rows come back (engine.py). Either the
-- ids are locked first and carried in a session variable as a JSON array, or,
-- for one row, the last statement reads row_count() of the update before it
-- (the connection counts rows matched, not only rows changed). An insert that
-- meets a key that exists already stops the query with no rows back (MySQL's
-- duplicate key, 1062: the statement alone rolls back, the transaction goes
-- on), as ON CONFLICT DO NOTHING does on PostgreSQL. Literal percent signs are
-- doubled: every statement is sent with parameters.

-- name: now
-- The database clock: the only clock expiry trusts.
select $now as now;

-- name: lock_holders
-- The other transactions holding row locks in this database (MariaDB names a
-- lock's table only while someone waits for it: every such transaction of a
-- session using this database is shown, oldest first; another database's
-- transactions are not this table's holders).
select t.trx_mysql_thread_id as pid, coalesce(p.user, '') as application,
       coalesce(p.command, '') as state,
       timestampdiff(microsecond, t.trx_started, now(6)) / 1000000 as seconds,
       left(coalesce(t.trx_query, p.info, ''), 200) as query
from information_schema.innodb_trx t
left join information_schema.processlist p on p.id = t.trx_mysql_thread_id
where t.trx_mysql_thread_id <> connection_id() and t.trx_rows_locked > 0
  and p.db = database()
  and %(table)s is not null
order by t.trx_started, t.trx_mysql_thread_id
limit 5;
