-- PostgreSQL's named queries for history: each policy's state once a minute.

-- name: sample_insert
-- Keep one policy's sample of a minute; a minute sampled before (by another
-- process) keeps its first.
insert into expiry.samples (policy, minute, backlog, retrying, dead, oldest_age, held)
values (%(policy)s, %(minute)s, %(backlog)s, %(retrying)s, %(dead)s, %(oldest_age)s, %(held)s)
on conflict (policy, minute) do nothing;

-- name: sample_list
-- The samples from a minute on, of one policy (null: every policy), oldest first.
select policy, minute, backlog, retrying, dead, oldest_age, held from expiry.samples
where minute >= %(since)s and (%(policy)s::text is null or policy = %(policy)s)
order by minute, policy;

-- name: sample_prune
-- Delete the samples older than the given age.
delete from expiry.samples where minute < now() - make_interval(secs => %(age)s);
