-- 0009: scoped API keys and cron targets that belong to a key.
--
-- A key holds a JSON array of scopes (keys.py lists them); keys made before
-- this migration keep doing everything, as "admin" (narrow them with
-- `expiry keys scope NAME --scope ...`). A cron target belongs to the key
-- that created it; one made before this migration has no owner, and only an
-- admin key sees it.
alter table expiry.api_keys add column scopes jsonb not null default '["admin"]';
alter table expiry.cron_targets add column owner text;
