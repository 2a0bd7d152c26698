-- MySQL/MariaDB's named queries for who acts: the workers' roll, API keys, the HTTP API's idempotency records.
-- (This engine's conventions are at the top of database.sql.)

-- name: key_insert
-- Store a new API key's hash (the secret itself is never stored).
insert into expiry_api_keys (name, hash, scopes, created_at)
values (%(name)s, %(hash)s, %(scopes)s, $now);
select %(name)s as name from dual;

-- name: key_list
-- Every API key, without secrets.
select name, scopes, created_at, revoked_at from expiry_api_keys order by name;

-- name: key_revoke
-- Revoke a key; it stops working at once.
update expiry_api_keys set revoked_at = $now where name = %(name)s and revoked_at is null;
select %(name)s as name from dual where row_count() > 0;

-- name: key_set_scopes
-- Replace the scopes of a key in force.
update expiry_api_keys set scopes = %(scopes)s where name = %(name)s and revoked_at is null;
select %(name)s as name from dual where row_count() > 0;

-- name: key_active
-- Hashes of every key still in force.
select name, hash, scopes from expiry_api_keys where revoked_at is null;

-- name: idempotency_begin
-- Record that a request with this key is in flight; no row back means it exists.
insert into expiry_idempotency (api_key, `key`, request_hash, created_at)
values (%(api_key)s, %(key)s, %(hash)s, $now);
select %(key)s as `key` from dual;

-- name: idempotency_get
-- A stored request: its body hash and, once finished, its response.
select request_hash, status, body from expiry_idempotency
where api_key = %(api_key)s and `key` = %(key)s and created_at > $now - interval 24 hour;

-- name: idempotency_finish
-- Store the first response for replay.
update expiry_idempotency set status = %(status)s, body = %(body)s
where api_key = %(api_key)s and `key` = %(key)s;

-- name: idempotency_forget
-- Drop an in-flight record whose request failed before answering, or one expired.
delete from expiry_idempotency
where (api_key = %(api_key)s and `key` = %(key)s) or created_at < $now - interval 24 hour;

-- name: worker_seen
-- A worker process's roll call at each heartbeat: who it is, what it works,
-- how many jobs it holds and which queues rest.
insert into expiry_workers (name, host, pid, threads, queues, resting, holding, health,
                            started_at, seen_at)
values (%(name)s, %(host)s, %(pid)s, %(threads)s, %(queues)s, %(resting)s, %(holding)s,
        %(health)s, $now, $now)
on duplicate key update threads = values(threads), queues = values(queues),
    resting = values(resting), holding = values(holding), health = values(health), seen_at = $now;

-- name: worker_forget
-- Workers not seen for a day are forgotten (killed without a word).
delete from expiry_workers where seen_at < $now - interval 1 day;

-- name: worker_gone
-- A worker that stopped cleanly leaves the roll.
delete from expiry_workers where name = %(name)s;

-- name: worker_list
-- The roll, newest first, with how long ago each was seen (the database's clock).
select name, host, pid, threads, queues, resting, holding, health, started_at, seen_at,
       timestampdiff(microsecond, seen_at, $now) / 1e6 as seen_seconds_ago
from expiry_workers order by started_at desc, name;
