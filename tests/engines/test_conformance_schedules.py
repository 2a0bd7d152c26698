"""Schedules on every engine: register, list, the compare-and-set that claims
fires, pause and resume, and the version that tells a sleeping scheduler.

Each test runs once on SQLite and once on PostgreSQL (the ``engine`` fixture).
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from _conformance import is_utc, utc

from expiry.engines import Engine
from expiry.types import Schedule

T0 = utc(2030, 1, 1)


def schedule(engine: Engine, policy: str) -> Schedule:
    [found] = [s for s in engine.schedule_list() if s.policy == policy]
    return found


def test_schedule_register_then_list_starts_counting_from_the_time_given(
    engine: Engine,
) -> None:
    engine.schedule_register("p", T0)

    found = schedule(engine, "p")
    assert (found.policy, found.paused, found.last_fire_at) == ("p", False, T0)
    assert is_utc(found.last_fire_at) and is_utc(found.updated_at)


def test_schedule_register_again_keeps_the_first_time(engine: Engine) -> None:
    engine.schedule_register("p", T0)
    engine.schedule_register("p", T0 + timedelta(hours=5))

    assert schedule(engine, "p").last_fire_at == T0


def test_schedule_list_is_ordered_by_policy(engine: Engine) -> None:
    assert engine.schedule_list() == []
    for name in ("m", "b", "x"):
        engine.schedule_register(name, T0)

    assert [s.policy for s in engine.schedule_list()] == ["b", "m", "x"]


def test_schedule_register_in_a_rolled_back_transaction_leaves_nothing(engine: Engine) -> None:
    with pytest.raises(RuntimeError), engine.transaction() as conn:
        engine.schedule_register("p", T0, conn=conn)
        raise RuntimeError("roll back")
    assert engine.schedule_list() == []


def test_schedule_advance_claims_once_from_the_value_read(engine: Engine) -> None:
    engine.schedule_register("p", T0)
    read = schedule(engine, "p")
    fire = T0 + timedelta(hours=1)

    assert engine.schedule_advance(read, fire) is True
    assert schedule(engine, "p").last_fire_at == fire
    # A scheduler that read before the claim claims nothing, even a later fire.
    assert engine.schedule_advance(read, fire + timedelta(hours=1)) is False
    assert schedule(engine, "p").last_fire_at == fire


def test_schedule_advance_reads_back_its_own_stored_time(engine: Engine) -> None:
    """The time a first sight stores (the database's now, with its fraction) and
    one set by pause are matched exactly when read back: the compare-and-set holds
    on SQLite's epoch seconds as on PostgreSQL's timestamptz."""
    engine.schedule_register("p", engine.now())
    engine.schedule_set_paused("q", False)  # first sight through pause/resume: now()
    for name in ("p", "q"):
        read = schedule(engine, name)
        assert read.last_fire_at is not None
        assert engine.schedule_advance(read, read.last_fire_at + timedelta(minutes=1)) is True


def test_schedule_advance_needs_a_later_fire(engine: Engine) -> None:
    engine.schedule_register("p", T0)
    read = schedule(engine, "p")

    assert engine.schedule_advance(read, T0) is False
    assert engine.schedule_advance(read, T0 - timedelta(hours=1)) is False
    assert schedule(engine, "p").last_fire_at == T0


def test_schedule_advance_claims_nothing_while_paused(engine: Engine) -> None:
    engine.schedule_register("p", T0)
    engine.schedule_set_paused("p", True)
    read = schedule(engine, "p")

    assert read.paused is True
    assert engine.schedule_advance(read, T0 + timedelta(hours=1)) is False
    engine.schedule_set_paused("p", False)
    assert engine.schedule_advance(schedule(engine, "p"), T0 + timedelta(hours=1)) is True


def test_schedule_set_paused_toggles_and_registers_an_unknown_policy(engine: Engine) -> None:
    before = engine.now()
    engine.schedule_set_paused("new", True)
    found = schedule(engine, "new")
    assert found.paused is True
    assert found.last_fire_at is not None and before <= found.last_fire_at <= engine.now()

    engine.schedule_register("p", T0)
    engine.schedule_set_paused("p", True)
    assert schedule(engine, "p").paused is True
    engine.schedule_set_paused("p", False)
    found = schedule(engine, "p")
    assert found.paused is False and found.last_fire_at == T0  # resuming keeps the last fire


def test_schedule_version_changes_when_a_schedule_does(engine: Engine) -> None:
    at, n = engine.schedule_version()
    assert (at, n) == (utc(1970, 1, 1), 0) and is_utc(at)

    engine.schedule_register("p", T0)
    registered = engine.schedule_version()
    assert registered[1] == 1 and registered[0] == schedule(engine, "p").updated_at
    assert engine.schedule_version() == registered  # unchanged while nothing changes

    time.sleep(0.01)  # SQLite's clock counts milliseconds
    engine.schedule_set_paused("p", True)
    paused = engine.schedule_version()
    assert paused[1] == 1 and paused[0] > registered[0]


def test_schedule_set_paused_records_who_paused_it_and_resume_clears_it(engine: Engine) -> None:
    engine.schedule_set_paused("p", True, by="throttle")
    [stopped] = engine.schedule_list()
    assert stopped.paused and stopped.paused_by == "throttle"
    engine.schedule_set_paused("p", False)
    [resumed] = engine.schedule_list()
    assert not resumed.paused and resumed.paused_by is None
    engine.schedule_set_paused("p", True)  # an operator's pause names nobody
    [paused] = engine.schedule_list()
    assert paused.paused and paused.paused_by is None
