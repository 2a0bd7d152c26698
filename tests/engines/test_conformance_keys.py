"""API keys on every engine: store a hash, list without secrets, revoke, and
read the hashes still in force.

Each test runs once on SQLite and once on PostgreSQL (the ``engine`` fixture).
"""

from __future__ import annotations

import pytest
from _conformance import drop_expiry_tables, execute, is_utc

from expiry.engines import Engine


def test_key_insert_then_list_shows_the_key_without_its_hash(engine: Engine) -> None:
    before = engine.now()
    assert engine.key_insert("ci-bot", "hash-1") is True

    [key] = engine.key_list()
    assert key.name == "ci-bot" and key.revoked_at is None
    assert is_utc(key.created_at) and before <= key.created_at <= engine.now()
    assert "hash-1" not in repr(key)


def test_key_insert_of_an_existing_name_is_refused_revoked_or_not(engine: Engine) -> None:
    assert engine.key_insert("ci-bot", "hash-1") is True
    assert engine.key_insert("ci-bot", "hash-2") is False
    assert {n: k.hash for n, k in engine.key_active().items()} == {"ci-bot": "hash-1"}

    engine.key_revoke("ci-bot")
    assert engine.key_insert("ci-bot", "hash-3") is False
    assert engine.key_active() == {}


def test_key_insert_in_a_rolled_back_transaction_leaves_nothing(engine: Engine) -> None:
    with pytest.raises(RuntimeError), engine.transaction() as conn:
        assert engine.key_insert("ci-bot", "hash-1", conn=conn)
        raise RuntimeError("roll back")
    assert engine.key_list() == []


def test_key_list_is_ordered_by_name_and_includes_revoked_keys(engine: Engine) -> None:
    for name in ("ops", "alice", "ci-bot"):
        engine.key_insert(name, f"hash-{name}")
    engine.key_revoke("ops")

    keys = engine.key_list()
    assert [k.name for k in keys] == ["alice", "ci-bot", "ops"]
    assert [k.revoked_at is not None for k in keys] == [False, False, True]
    assert is_utc(keys[2].revoked_at)


def test_key_revoke_revokes_once_and_only_a_known_key(engine: Engine) -> None:
    engine.key_insert("ci-bot", "hash-1")
    before = engine.now()

    assert engine.key_revoke("ci-bot") is True
    [key] = engine.key_list()
    assert key.revoked_at is not None and before <= key.revoked_at <= engine.now()
    assert engine.key_revoke("ci-bot") is False  # already revoked: the time stays
    assert engine.key_list()[0].revoked_at == key.revoked_at
    assert engine.key_revoke("nobody") is False


def test_key_active_maps_each_key_in_force_to_its_hash(engine: Engine) -> None:
    assert engine.key_active() == {}
    engine.key_insert("alice", "hash-a")
    engine.key_insert("ci-bot", "hash-c")
    engine.key_insert("ops", "hash-o")
    engine.key_revoke("ops")

    active = engine.key_active()
    assert {n: k.hash for n, k in active.items()} == {"alice": "hash-a", "ci-bot": "hash-c"}


def test_key_insert_keeps_the_scopes_and_key_active_reads_them(engine: Engine) -> None:
    assert engine.key_insert("ci", "hash-1", ["queue:publish:ci.*", "read"])
    assert engine.key_active()["ci"].scopes == ("queue:publish:ci.*", "read")
    [key] = engine.key_list()
    assert key.scopes == ("queue:publish:ci.*", "read")


def test_key_set_scopes_replaces_them_for_a_key_in_force_only(engine: Engine) -> None:
    engine.key_insert("ci", "hash-1")
    assert engine.key_active()["ci"].scopes == ("admin",)
    assert engine.key_set_scopes("ci", ["read"]) is True
    assert engine.key_active()["ci"].scopes == ("read",)
    engine.key_revoke("ci")
    assert engine.key_set_scopes("ci", ["admin"]) is False
    assert engine.key_set_scopes("nobody", ["read"]) is False


def test_keys_made_before_migration_0009_become_admin(engine: Engine) -> None:
    every = engine.migrations
    try:
        drop_expiry_tables(engine)
        engine.migrations = [m for m in every if m[0] < 9]
        engine.migrate()
        execute(
            engine,
            "insert into expiry.api_keys (name, hash, created_at) values ('old', 'h', %s)",
            (engine.time_param(engine.now()),),
        )
    finally:
        engine.migrations = every
    engine.migrate()
    assert engine.key_active()["old"].scopes == ("admin",)
