-- SQLite's named queries for history: each policy's state once a minute.
-- (This engine's conventions are at the top of database.sql.)

-- name: sample_insert
-- Keep one policy's sample of a minute; a minute sampled before (by another
-- process) keeps its first.
insert into expiry_samples (policy, minute, backlog, retrying, dead, oldest_age, held)
values (:policy, :minute, :backlog, :retrying, :dead, :oldest_age, :held)
on conflict (policy, minute) do nothing;

-- name: sample_list
-- The samples from a minute on, of one policy (null: every policy), oldest first.
select policy, minute, backlog, retrying, dead, oldest_age, held from expiry_samples
where minute >= :since and (:policy is null or policy = :policy)
order by minute, policy;

-- name: sample_prune
-- Delete the samples older than the given age.
delete from expiry_samples where minute < $now - :age;
