-- MySQL/MariaDB's named queries for history: each policy's state once a minute.
-- (This engine's conventions are at the top of database.sql.)

-- name: sample_insert
-- Keep one policy's sample of a minute; a minute sampled before (by another
-- process) keeps its first (its primary key refuses the second: ignored).
insert ignore into expiry_samples (policy, minute, backlog, retrying, dead, oldest_age, held)
values (%(policy)s, %(minute)s, %(backlog)s, %(retrying)s, %(dead)s, %(oldest_age)s, %(held)s);

-- name: sample_list
-- The samples from a minute on, of one policy (null: every policy), oldest first.
select policy, minute, backlog, retrying, dead, oldest_age, held from expiry_samples
where minute >= %(since)s and (%(policy)s is null or policy = %(policy)s)
order by minute, policy;

-- name: sample_prune
-- Delete the samples older than the given age.
delete from expiry_samples
where minute < $now - interval round(%(age)s * 1000000) microsecond;
