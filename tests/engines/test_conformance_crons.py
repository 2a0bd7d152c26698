"""HTTP cron targets and their calls on every engine: create, read, list,
delete, pause, the compare-and-set that claims a fire, and the call history.

Each test runs once on SQLite and once on PostgreSQL (the ``engine`` fixture).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from _conformance import is_utc, utc

from expiry.engines import Engine
from expiry.types import CronTarget

URL = "https://hooks.example.com/nightly"


def create(engine: Engine, name: str, secret: str = "whsec_x") -> None:
    assert engine.cron_insert(name, URL, "0 3 * * *", "Europe/Paris", secret) is True


def target(engine: Engine, name: str) -> CronTarget:
    found = engine.cron_get(name)
    assert found is not None
    return found


def test_cron_insert_then_get_returns_the_target_with_its_secret(engine: Engine) -> None:
    before = engine.now()
    create(engine, "nightly", "whsec_abc")
    after = engine.now()

    found = target(engine, "nightly")
    assert (found.name, found.http_url, found.schedule, found.timezone) == (
        "nightly",
        URL,
        "0 3 * * *",
        "Europe/Paris",
    )
    assert found.secret == "whsec_abc" and "whsec_abc" not in repr(found)
    assert found.paused is False
    # Fires count from creation: no call for the times before it.
    assert found.last_fire_at is not None and before <= found.last_fire_at <= after
    assert is_utc(found.created_at) and is_utc(found.updated_at)


def test_cron_insert_of_an_existing_name_is_refused_and_changes_nothing(engine: Engine) -> None:
    create(engine, "nightly", "whsec_first")
    assert engine.cron_insert("nightly", "https://other.example.com", "* * * * *", "UTC", "s2") is (
        False
    )

    found = target(engine, "nightly")
    assert (found.http_url, found.secret) == (URL, "whsec_first")


def test_cron_insert_in_a_rolled_back_transaction_leaves_nothing(engine: Engine) -> None:
    with pytest.raises(RuntimeError), engine.transaction() as conn:
        assert engine.cron_insert("nightly", URL, "0 3 * * *", "UTC", "s", conn=conn)
        raise RuntimeError("roll back")
    assert engine.cron_get("nightly") is None


def test_cron_get_of_an_unknown_name_is_none(engine: Engine) -> None:
    assert engine.cron_get("nope") is None


def test_cron_list_is_ordered_by_name(engine: Engine) -> None:
    assert engine.cron_list() == []
    for name in ("weekly", "daily", "hourly"):
        create(engine, name)

    assert [t.name for t in engine.cron_list()] == ["daily", "hourly", "weekly"]
    assert engine.cron_list()[0] == target(engine, "daily")


def test_cron_delete_removes_the_target_once_and_keeps_its_calls(engine: Engine) -> None:
    create(engine, "nightly")
    engine.cron_call_insert(
        "nightly", utc(2030, 1, 1), 1, status=200, duration_ms=5.0, response="ok", error=None
    )

    assert engine.cron_delete("nightly") is True
    assert engine.cron_get("nightly") is None
    assert engine.cron_delete("nightly") is False
    assert [c.status for c in engine.cron_calls("nightly")] == [200]


def test_cron_set_paused_toggles_a_known_target_only(engine: Engine) -> None:
    create(engine, "nightly")

    assert engine.cron_set_paused("nightly", True) is True
    assert target(engine, "nightly").paused is True
    assert engine.cron_set_paused("nightly", False) is True
    assert target(engine, "nightly").paused is False
    assert engine.cron_set_paused("nope", True) is False
    assert engine.cron_get("nope") is None


def test_cron_advance_claims_a_fire_once_from_the_value_read(engine: Engine) -> None:
    create(engine, "nightly")
    read = target(engine, "nightly")  # last_fire_at: the database's now, as stored
    assert read.last_fire_at is not None
    fire = read.last_fire_at.replace(microsecond=0) + timedelta(minutes=1)

    assert engine.cron_advance(read, fire) is True
    assert target(engine, "nightly").last_fire_at == fire
    # A scheduler that read before the claim claims nothing, even a later fire.
    assert engine.cron_advance(read, fire + timedelta(minutes=1)) is False
    # Read again, the same fire is not later than the last: nothing to claim.
    assert engine.cron_advance(target(engine, "nightly"), fire) is False
    assert engine.cron_advance(target(engine, "nightly"), fire + timedelta(minutes=1)) is True


def test_cron_advance_claims_nothing_while_paused(engine: Engine) -> None:
    create(engine, "nightly")
    engine.cron_set_paused("nightly", True)
    read = target(engine, "nightly")
    assert read.last_fire_at is not None

    assert engine.cron_advance(read, read.last_fire_at + timedelta(minutes=1)) is False
    assert target(engine, "nightly").last_fire_at == read.last_fire_at


def test_cron_call_insert_then_calls_newest_first_limited(engine: Engine) -> None:
    create(engine, "nightly")
    create(engine, "other")
    fire = utc(2030, 1, 1, 3)
    before = engine.now()
    engine.cron_call_insert(
        "nightly", fire, 1, status=None, duration_ms=10000.0, response=None, error="timed out"
    )
    engine.cron_call_insert(
        "nightly", fire, 2, status=500, duration_ms=12.5, response="oops", error="HTTP 500"
    )
    engine.cron_call_insert(
        "nightly", fire, 3, status=204, duration_ms=3.25, response="", error=None
    )
    engine.cron_call_insert(
        "other", fire, 1, status=200, duration_ms=1.0, response="ok", error=None
    )

    calls = engine.cron_calls("nightly")
    assert [c.attempt for c in calls] == [3, 2, 1]
    newest, _, oldest = calls
    assert (newest.name, newest.fire_time, newest.status, newest.duration_ms) == (
        "nightly",
        fire,
        204,
        3.25,
    )
    assert (newest.response, newest.error) == ("", None)
    assert (oldest.status, oldest.response, oldest.error) == (None, None, "timed out")
    assert is_utc(newest.at) and before <= newest.at <= engine.now()
    assert [c.attempt for c in engine.cron_calls("nightly", limit=2)] == [3, 2]
    assert engine.cron_calls("none") == []


def test_cron_insert_records_the_owning_key(engine: Engine) -> None:
    assert engine.cron_insert("mine", URL, "@daily", "UTC", "whsec_a", owner="alice")
    create(engine, "operators", "whsec_b")
    assert target(engine, "mine").owner == "alice"
    assert target(engine, "operators").owner is None


def test_cron_update_sets_url_schedule_and_zone_and_keeps_the_rest(engine: Engine) -> None:
    create(engine, "nightly", secret="whsec_kept")
    before = target(engine, "nightly")

    assert engine.cron_update("nightly", "https://hooks.example.com/v2", "*/5 * * * *", "UTC")
    after = target(engine, "nightly")
    assert (after.http_url, after.schedule, after.timezone) == (
        "https://hooks.example.com/v2",
        "*/5 * * * *",
        "UTC",
    )
    assert (after.secret, after.owner, after.paused) == ("whsec_kept", before.owner, False)
    assert after.last_fire_at == before.last_fire_at
    assert engine.cron_update("nope", URL, "@daily", "UTC") is False
    assert engine.cron_get("nope") is None


def test_cron_insert_and_update_keep_a_targets_own_call_timeout(engine: Engine) -> None:
    """None by default ([http] call_timeout); stated at insert, changed and
    cleared by update, read back exactly."""
    create(engine, "default")
    assert target(engine, "default").timeout is None
    assert engine.cron_insert("patient", URL, "@daily", "UTC", "whsec_y", timeout=90.5)
    assert target(engine, "patient").timeout == 90.5
    assert engine.cron_update("patient", URL, "@daily", "UTC", timeout=0.25)
    assert target(engine, "patient").timeout == 0.25
    assert engine.cron_update("patient", URL, "@daily", "UTC", timeout=None)
    assert target(engine, "patient").timeout is None
    assert target(engine, "default").timeout is None
