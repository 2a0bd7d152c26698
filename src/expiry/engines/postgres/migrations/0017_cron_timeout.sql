-- 0017: a cron target's own call timeout.
--
-- Every call had [http] call_timeout (10 s): a target that takes a minute to
-- answer (a report, a digest) failed every fire, and changing it meant a new
-- config for every target. A target may now state its own (null: the
-- config's), set when created and changed like its URL.
alter table expiry.cron_targets add column timeout_seconds double precision;
