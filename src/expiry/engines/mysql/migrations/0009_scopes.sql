-- 0009: scoped API keys and cron targets that belong to a key
-- (postgres/migrations/0009 says why). Scopes are a JSON array as text; keys
-- made before this migration are "admin".
alter table expiry_api_keys add column scopes varchar(1000) not null
    default '["admin"]';
alter table expiry_cron_targets add column owner varchar(255);
