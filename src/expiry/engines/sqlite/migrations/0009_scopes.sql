-- 0009: scoped API keys and cron targets that belong to a key
-- (postgres/migrations/0009 says why). Scopes are a JSON array as text.
alter table expiry_api_keys add column scopes text not null default '["admin"]';
alter table expiry_cron_targets add column owner text;
