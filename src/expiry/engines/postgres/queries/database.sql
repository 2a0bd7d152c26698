-- PostgreSQL's named queries for the database itself: its clock and who holds locks on a table.

-- name: now
-- The database clock: the only clock expiry trusts.
select now() as now;

-- name: lock_holders
-- The other sessions holding a lock on a table of this database (a window's
-- lock wait waited behind one of them), oldest transaction first; a relation
-- id is only unique within its database.
select a.pid, coalesce(a.application_name, '') as application, coalesce(a.state, '') as state,
       extract(epoch from now() - a.xact_start)::float8 as seconds,
       left(coalesce(a.query, ''), 200) as query
from pg_stat_activity a
where a.pid <> pg_backend_pid()
  and a.pid in (select l.pid from pg_locks l
                where l.locktype = 'relation' and l.relation = to_regclass(%(table)s) and l.granted
                  and l.database = (select oid from pg_database where datname = current_database()))
order by a.xact_start nulls last, a.pid
limit 5;
