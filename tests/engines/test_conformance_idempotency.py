"""Idempotency records on every engine: one per (API key, Idempotency-Key), in
flight until finished, replayable for 24 hours, forgotten on demand.

Each test runs once on SQLite and once on PostgreSQL (the ``engine`` fixture).
"""

from __future__ import annotations

import pytest
from _conformance import age

from expiry.engines import Engine
from expiry.types import IdempotencyRecord

DAY = 24 * 3600


def test_idempotency_begin_records_once_in_flight(engine: Engine) -> None:
    assert engine.idempotency_begin("ci-bot", "k-1", "hash-1") is True
    assert engine.idempotency_begin("ci-bot", "k-1", "hash-2") is False

    assert engine.idempotency_get("ci-bot", "k-1") == IdempotencyRecord("hash-1", None, None)


def test_idempotency_keys_are_scoped_by_api_key(engine: Engine) -> None:
    engine.idempotency_begin("ci-bot", "k-1", "hash-1")

    assert engine.idempotency_get("other", "k-1") is None
    assert engine.idempotency_begin("other", "k-1", "hash-2") is True
    assert engine.idempotency_get("other", "k-1") == IdempotencyRecord("hash-2", None, None)
    assert engine.idempotency_get("ci-bot", "k-1") == IdempotencyRecord("hash-1", None, None)


def test_idempotency_get_of_an_unknown_key_is_none(engine: Engine) -> None:
    assert engine.idempotency_get("ci-bot", "nope") is None


def test_idempotency_finish_stores_the_response_to_replay(engine: Engine) -> None:
    engine.idempotency_begin("ci-bot", "k-1", "hash-1")
    engine.idempotency_finish("ci-bot", "k-1", 201, '{"run_id": "p:1"}')

    assert engine.idempotency_get("ci-bot", "k-1") == IdempotencyRecord(
        "hash-1", 201, '{"run_id": "p:1"}'
    )
    engine.idempotency_finish("other", "k-1", 500, "{}")  # no such record: nothing changes
    assert engine.idempotency_get("other", "k-1") is None


def test_idempotency_begin_in_a_rolled_back_transaction_leaves_nothing(engine: Engine) -> None:
    with pytest.raises(RuntimeError), engine.transaction() as conn:
        assert engine.idempotency_begin("ci-bot", "k-1", "hash-1", conn=conn)
        assert engine.idempotency_get("ci-bot", "k-1", conn=conn) is not None
        raise RuntimeError("roll back")
    assert engine.idempotency_get("ci-bot", "k-1") is None
    assert engine.idempotency_begin("ci-bot", "k-1", "hash-1") is True


def test_idempotency_forget_drops_the_record_so_it_can_begin_again(engine: Engine) -> None:
    engine.idempotency_begin("ci-bot", "k-1", "hash-1")
    engine.idempotency_begin("ci-bot", "k-2", "hash-2")

    engine.idempotency_forget("ci-bot", "k-1")
    assert engine.idempotency_get("ci-bot", "k-1") is None
    assert engine.idempotency_get("ci-bot", "k-2") is not None  # others stay
    assert engine.idempotency_begin("ci-bot", "k-1", "hash-3") is True


def test_idempotency_records_expire_after_24_hours(engine: Engine) -> None:
    engine.idempotency_begin("ci-bot", "old", "hash-1")
    engine.idempotency_finish("ci-bot", "old", 200, "{}")
    engine.idempotency_begin("ci-bot", "young", "hash-2")
    age(engine, "idempotency", "created_at", DAY + 60, "key = 'old'")

    assert engine.idempotency_get("ci-bot", "old") is None  # expired: not replayed
    assert engine.idempotency_begin("ci-bot", "old", "hash-3") is False  # but still stored
    # Forgetting any record drops every expired one too.
    engine.idempotency_forget("ci-bot", "unrelated")
    assert engine.idempotency_begin("ci-bot", "old", "hash-3") is True
    assert engine.idempotency_get("ci-bot", "young") == IdempotencyRecord("hash-2", None, None)


def test_idempotency_records_younger_than_24_hours_replay(engine: Engine) -> None:
    engine.idempotency_begin("ci-bot", "k-1", "hash-1")
    engine.idempotency_finish("ci-bot", "k-1", 200, "{}")
    age(engine, "idempotency", "created_at", DAY - 60)

    engine.idempotency_forget("ci-bot", "unrelated")
    assert engine.idempotency_get("ci-bot", "k-1") == IdempotencyRecord("hash-1", 200, "{}")
