-- SQLite's named queries for who acts: the workers' roll, API keys, the HTTP API's idempotency records.
-- (This engine's conventions are at the top of database.sql.)

-- name: key_insert
-- Store a new API key's hash (the secret itself is never stored).
insert into expiry_api_keys (name, hash, scopes, created_at) values (:name, :hash, :scopes, $now)
on conflict (name) do nothing returning name;

-- name: key_list
-- Every API key, without secrets.
select name, scopes, created_at, revoked_at from expiry_api_keys order by name;

-- name: key_revoke
-- Revoke a key; it stops working at once.
update expiry_api_keys set revoked_at = $now where name = :name and revoked_at is null
returning name;

-- name: key_set_scopes
-- Replace the scopes of a key in force.
update expiry_api_keys set scopes = :scopes
where name = :name and revoked_at is null returning name;

-- name: key_active
-- Hashes of every key still in force.
select name, hash, scopes from expiry_api_keys where revoked_at is null;

-- name: idempotency_begin
-- Record that a request with this key is in flight; no row back means it exists.
insert into expiry_idempotency (api_key, key, request_hash, created_at)
values (:api_key, :key, :hash, $now)
on conflict (api_key, key) do nothing returning key;

-- name: idempotency_get
-- A stored request: its body hash and, once finished, its response.
select request_hash, status, body from expiry_idempotency
where api_key = :api_key and key = :key and created_at > $now - 86400;

-- name: idempotency_finish
-- Store the first response for replay.
update expiry_idempotency set status = :status, body = :body
where api_key = :api_key and key = :key;

-- name: idempotency_forget
-- Drop an in-flight record whose request failed before answering, or one expired.
delete from expiry_idempotency
where (api_key = :api_key and key = :key) or created_at < $now - 86400;

-- name: worker_seen
-- A worker process's roll call at each heartbeat (postgres/queries/access.sql).
insert into expiry_workers (name, host, pid, threads, queues, resting, holding, health,
                            started_at, seen_at)
values (:name, :host, :pid, :threads, :queues, :resting, :holding, :health, $now, $now)
on conflict (name) do update
set threads = excluded.threads, queues = excluded.queues, resting = excluded.resting,
    holding = excluded.holding, health = excluded.health, seen_at = $now;

-- name: worker_forget
-- Workers not seen for a day are forgotten (SQLite runs one statement a query).
delete from expiry_workers where seen_at < $now - 86400;

-- name: worker_gone
-- A worker that stopped cleanly leaves the roll.
delete from expiry_workers where name = :name;

-- name: worker_list
-- The roll, newest first, with how long ago each was seen.
select name, host, pid, threads, queues, resting, holding, health, started_at, seen_at,
       $now - seen_at as seen_seconds_ago
from expiry_workers order by started_at desc, name;
