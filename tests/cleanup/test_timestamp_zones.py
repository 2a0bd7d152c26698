"""Naive times written in a zone other than UTC (timestamp_zone): Django with
USE_TZ = False, Rails with default_timezone = :local, PHP apps writing local
time. A naive column is read as wall-clock time of the policy's zone; in the
hours when clocks change, a value that could be two instants counts as the
later one, so it is deleted only once both have passed. The oracles here are
independent of expiry's code: Django's own rule for clearsessions, and each
row's possible instants written out by hand."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from expiry.app import App
from expiry.errors import ConfigError, SchemaError
from expiry.timestamps import Storage, latest_instant, wall_bound, zone_of

from ._support import Db, config_data, drain

Apps = Callable[..., App]
POLICY = "expired-sessions"
CHICAGO = "America/Chicago"
NAIVE = {"postgres": "timestamp without time zone", "mysql": "datetime(6)", "sqlite": "datetime"}
"""A naive time column as each engine's apps declare it (Django's on MySQL and SQLite)."""
HOW = {
    "postgres": "naive timestamp without time zone",
    "mysql": "naive datetime(6)",
    "sqlite": "naive ISO-8601 text (a space between date and time)",
}
"""How check and plan name such a column."""


def stored(db: Db, wall: datetime) -> Any:
    """A naive wall-clock time as the app writes it: a driver datetime, or on
    SQLite the text Django writes (str(datetime))."""
    return str(wall) if db.dialect == "sqlite" else wall


def insert_many(db: Db, table: str, columns: str, rows: Sequence[Sequence[Any]]) -> None:
    width = len(rows[0])
    for start in range(0, len(rows), 500):
        chunk = rows[start : start + 500]
        values = ", ".join("(" + ", ".join(["%s"] * width) + ")" for _ in chunk)
        db.execute(
            f"insert into {table} ({columns}) values {values}", [v for r in chunk for v in r]
        )


def run_at(app: App, cutoff: datetime) -> None:
    assert app.cleanup is not None
    app.cleanup.open_run(POLICY, cutoff)
    drain(app)


# -- Django: USE_TZ = False, TIME_ZONE = "America/Chicago" ---------------------------------

DJANGO_CUTOFF = datetime(2026, 1, 15, 18, 0, tzinfo=UTC)  # 12:00 CST in Chicago
DJANGO = {
    "table": "django_session",
    "key": "session_key",
    "timestamp": "expire_date",
    "where": None,
    "window": 100,
}


def django_sessions(db: Db) -> dict[str, datetime]:
    """django_session as Django creates it, with 2,000 sessions whose expire_date
    is Chicago wall-clock time: 1,000 expired up to 3.6 hours before the cutoff,
    1,000 live up to 3.6 hours after it (read as UTC, all 2,000 look expired)."""
    db.execute(
        "create table django_session (session_key varchar(40) not null primary key,"
        f" session_data text not null, expire_date {NAIVE[db.dialect]} not null)"
    )
    db.execute("create index django_session_expire_date on django_session (expire_date)")
    local_now = DJANGO_CUTOFF.astimezone(ZoneInfo(CHICAGO)).replace(tzinfo=None)
    sessions = {}
    for i in range(2000):
        sign = -1 if i % 2 == 0 else 1
        sessions[f"s{i:05d}"] = local_now + sign * timedelta(
            seconds=(i // 2 + 1) * 13, microseconds=i
        )
    insert_many(
        db,
        "django_session",
        "session_key, session_data, expire_date",
        [(k, "e30=", stored(db, v)) for k, v in sessions.items()],
    )
    return sessions


def djangos_clearsessions(sessions: dict[str, datetime], now: datetime) -> set[str]:
    """What `manage.py clearsessions` deletes: expire_date < timezone.now(), which
    with USE_TZ = False is the naive wall clock of TIME_ZONE."""
    local_now = now.astimezone(ZoneInfo(CHICAGO)).replace(tzinfo=None)
    return {k for k, v in sessions.items() if v < local_now}


def test_django_local_times_delete_exactly_djangos_expired_half(db: Db, apps: Apps) -> None:
    sessions = django_sessions(db)
    expired = djangos_clearsessions(sessions, DJANGO_CUTOFF)
    assert len(expired) == 1000

    as_utc = apps(db.url, DJANGO)  # the issue: read as UTC, every session is a candidate
    assert as_utc.cleanup is not None
    assert as_utc.cleanup.preview(POLICY, DJANGO_CUTOFF).candidates == 2000
    reading = as_utc.cleanup.preview(POLICY, DJANGO_CUTOFF).storage
    assert "read as UTC (set timestamp_zone if your app writes local time)" in reading

    app = apps(db.url, DJANGO | {"timestamp_zone": CHICAGO})
    assert app.cleanup is not None
    preview = app.cleanup.preview(POLICY, DJANGO_CUTOFF)
    run_at(app, DJANGO_CUTOFF)
    left = {str(r[0]) for r in db.rows("select session_key from django_session")}
    assert len(set(sessions) - left) == 1000  # deleted
    assert left == set(sessions) - expired
    assert preview.candidates == 1000
    assert f"{HOW[db.dialect]}, read as {CHICAGO} wall-clock time" in preview.storage


def test_the_database_default_zone_applies_to_a_policy_without_its_own(db: Db, apps: Apps) -> None:
    sessions = django_sessions(db)
    data = config_data(db.url, DJANGO)
    data["database"]["timestamp_zone"] = CHICAGO
    from expiry.config import parse_config

    app = App(config=parse_config(data))
    try:
        run_at(app, DJANGO_CUTOFF)
    finally:
        app.close()
    left = {str(r[0]) for r in db.rows("select session_key from django_session")}
    assert left == set(sessions) - djangos_clearsessions(sessions, DJANGO_CUTOFF)


# -- when clocks change ----------------------------------------------------------------------


def naive_table(db: Db, walls: Sequence[datetime]) -> None:
    db.execute(f"create table sessions (id integer primary key, expires_at {NAIVE[db.dialect]})")
    db.execute("create index sessions_expires_at on sessions (expires_at)")
    insert_many(
        db, "sessions", "id, expires_at", [(i, stored(db, w)) for i, w in enumerate(walls, 1)]
    )


def z(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# Chicago falls back on 2025-11-02 at 07:00Z: 02:00 CDT becomes 01:00 CST, so
# the wall-clock hour 01:00-02:00 happens twice. Each row: its wall-clock time
# and every instant it can mean, by hand (CDT is UTC-5, CST UTC-6).
FALL_BACK: list[tuple[str, list[str]]] = [
    ("2025-11-02 00:30:00", ["05:30"]),
    ("2025-11-02 00:59:59", ["05:59:59"]),
    ("2025-11-02 01:00:00", ["06:00", "07:00"]),
    ("2025-11-02 01:15:00", ["06:15", "07:15"]),
    ("2025-11-02 01:30:00", ["06:30", "07:30"]),
    ("2025-11-02 01:59:59", ["06:59:59", "07:59:59"]),
    ("2025-11-02 02:00:00", ["08:00"]),
    ("2025-11-02 02:30:00", ["08:30"]),
]


def by_hand(day: str, rows: list[tuple[str, list[str]]], cutoff: datetime) -> set[int]:
    """The rows not expired at ``cutoff``: those with an instant not yet passed."""
    return {
        i
        for i, (_, instants) in enumerate(rows, 1)
        if any(z(f"{day}T{t}") >= cutoff for t in instants)
    }


FALL_BACK_CUTOFFS = [
    "2025-11-02T06:45:00",  # 01:45 CDT, the first pass: the repeated hour waits
    "2025-11-02T07:20:00",  # 01:20 CST, the second pass: 01:00 and 01:15 have passed twice
    "2025-11-02T08:00:00",  # 02:00 CST
    "2025-11-02T08:15:00",
]


def test_a_repeated_hour_is_kept_until_both_its_instants_have_passed(db: Db, apps: Apps) -> None:
    naive_table(db, [datetime.fromisoformat(w) for w, _ in FALL_BACK])
    app = apps(db.url, {"where": None, "timestamp_zone": CHICAGO, "window": 2})
    for cutoff in FALL_BACK_CUTOFFS:  # a run at each, in turn
        run_at(app, z(cutoff))
        assert db.ids() == by_hand("2025-11-02", FALL_BACK, z(cutoff)), cutoff


# Chicago springs forward on 2026-03-08 at 08:00Z: 02:00 CST becomes 03:00 CDT,
# so no clock there reads 02:00-03:00. A value in that hour (an app that added
# an hour to 01:30, say) can mean either offset's reading.
SPRING_FORWARD: list[tuple[str, list[str]]] = [
    ("2026-03-08 01:30:00", ["07:30"]),
    ("2026-03-08 02:15:00", ["07:15", "08:15"]),
    ("2026-03-08 02:45:00", ["07:45", "08:45"]),
    ("2026-03-08 03:10:00", ["08:10"]),
    ("2026-03-08 03:50:00", ["08:50"]),
    ("2026-03-08 04:30:00", ["09:30"]),
]


SPRING_FORWARD_RUNS: list[tuple[str, set[int]]] = [
    ("2026-03-08T08:05:00", {2, 3, 4, 5, 6}),
    # 03:20 CDT: 02:15 has passed at both offsets, 02:45 has not. 03:10 has
    # passed too, but sorts after 02:45: one comparison keeps it, for at most
    # the hour after the change (the bound is 02:20, never later).
    ("2026-03-08T08:20:00", {3, 4, 5, 6}),
    ("2026-03-08T09:00:00", {6}),
]


def test_a_skipped_hour_is_kept_until_both_its_readings_have_passed(db: Db, apps: Apps) -> None:
    naive_table(db, [datetime.fromisoformat(w) for w, _ in SPRING_FORWARD])
    app = apps(db.url, {"where": None, "timestamp_zone": CHICAGO, "window": 2})
    for cutoff, kept in SPRING_FORWARD_RUNS:
        run_at(app, z(cutoff))
        assert by_hand("2026-03-08", SPRING_FORWARD, z(cutoff)) <= db.ids()  # nothing live goes
        assert db.ids() == kept, cutoff


# -- the watermark, check and plan -------------------------------------------------------------

BOGOTA = "America/Bogota"
"""UTC-5 all year: the test does not depend on today's offset."""


def test_the_watermark_reads_naive_values_in_the_zone(db: Db, apps: Apps) -> None:
    wall = (datetime.now(UTC) - timedelta(hours=2)).astimezone(ZoneInfo(BOGOTA))
    naive_table(db, [wall.replace(tzinfo=None)])
    for zone, expected in ((BOGOTA, 2 * 3600), (None, 7 * 3600)):  # as UTC: 5 hours more
        app = apps(db.url, {"where": None} | ({"timestamp_zone": zone} if zone else {}))
        assert app.cleanup is not None
        assert app.cleanup.watermark(POLICY) == pytest.approx(expected, abs=120)


def test_check_says_how_naive_values_are_read_beside_now(db: Db, apps: Apps) -> None:
    wall = (datetime.now(UTC) - timedelta(hours=2)).astimezone(ZoneInfo(BOGOTA))
    naive_table(db, [wall.replace(tzinfo=None, microsecond=0)])
    app = apps(db.url, {"where": None, "timestamp_zone": BOGOTA})
    assert app.cleanup is not None
    assert app.cleanup.check() == []
    reading = app.cleanup.target(POLICY).reading
    shown = wall.replace(tzinfo=None, microsecond=0).isoformat(sep=" ")
    instant = wall.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert reading.startswith(
        f"expires_at: {HOW[db.dialect]}, read as {BOGOTA} wall-clock time; "
    ), reading
    assert f"oldest {shown} (= {instant}), newest {shown} (= {instant}), now 20" in reading

    plain = apps(db.url, {"where": None})
    assert plain.cleanup is not None
    plain.cleanup.check()
    assert "read as UTC (set timestamp_zone if your app writes local time)" in (
        plain.cleanup.target(POLICY).reading
    )


def test_check_warns_when_activity_times_look_written_in_another_zone(db: Db, apps: Apps) -> None:
    """A creation or activity time ahead of the database clock by about a zone's
    offset: the app writes local time east of how expiry reads it."""
    tokyo = datetime.now(UTC).astimezone(ZoneInfo("Asia/Tokyo"))  # UTC+9, no DST
    db.execute(
        f"create table sessions (id integer primary key, last_seen {NAIVE[db.dialect]},"
        f" expires_at {NAIVE[db.dialect]})"
    )
    db.execute("create index sessions_last_seen on sessions (last_seen)")
    db.execute("create index sessions_expires_at on sessions (expires_at)")
    wall = tokyo.replace(tzinfo=None, microsecond=0)
    db.execute("insert into sessions values (1, %s, %s)", [stored(db, wall), stored(db, wall)])
    app = apps(db.url, {"where": None, "timestamp": "last_seen"})
    assert app.cleanup is not None
    [warning] = app.cleanup.check()
    assert "timestamp column 'last_seen', read as UTC, holds a value about 9h00m ahead" in warning
    assert "timestamp_zone = the zone the app writes in" in warning
    [again] = app.cleanup.preview(POLICY).warnings  # plan says the same
    assert again.split(" (newest ")[0] == warning.split(" (newest ")[0]

    zoned = apps(db.url, {"where": None, "timestamp": "last_seen", "timestamp_zone": "Asia/Tokyo"})
    assert zoned.cleanup is not None and zoned.cleanup.check() == []
    deadline = apps(db.url, {"where": None})  # expires_at lies in the future by nature
    assert deadline.cleanup is not None and deadline.cleanup.check() == []


# -- columns that carry their zone -------------------------------------------------------------

ZONED = {
    "postgres": ("timestamptz", "timestamp with time zone, which carries its zone"),
    "mysql": ("timestamp(6) null", "timestamp(6), which carries its zone"),
    "sqlite": ("text", "ISO-8601 text (a space between date and time, UTC), which carries"),
}


def zoned_value(db: Db) -> Any:
    """2026-01-15 12:00 UTC as each engine's zoned column takes it."""
    if db.dialect == "sqlite":
        return "2026-01-15 12:00:00Z"
    noon = datetime(2026, 1, 15, 12, tzinfo=UTC)
    return noon if db.dialect == "postgres" else noon.replace(tzinfo=None)  # MySQL: session UTC


def test_a_zone_stated_for_a_column_that_carries_its_own_is_refused(db: Db, apps: Apps) -> None:
    declared, _ = ZONED[db.dialect]
    db.execute(f"create table sessions (id integer primary key, expires_at {declared})")
    value = zoned_value(db)
    db.execute("insert into sessions values (1, %s)", [value])
    app = apps(db.url, {"where": None, "timestamp_zone": CHICAGO})
    assert app.cleanup is not None
    with pytest.raises(SchemaError) as caught:
        app.cleanup.check()
    message = str(caught.value)
    assert "which carries its zone, but the policy states timestamp_zone = 'America/Chicago'" in (
        message
    )
    assert "Fix: remove timestamp_zone" in message
    assert db.ids() == {1}


def test_the_database_default_zone_does_not_apply_to_a_column_that_carries_its_own(
    db: Db,
) -> None:
    from expiry.config import parse_config

    declared, how = ZONED[db.dialect]
    db.execute(f"create table sessions (id integer primary key, expires_at {declared})")
    value = zoned_value(db)
    db.execute("insert into sessions values (1, %s)", [value])
    data = config_data(db.url, {"where": None})
    data["database"]["timestamp_zone"] = CHICAGO
    app = App(config=parse_config(data))
    try:
        assert app.cleanup is not None
        app.cleanup.check()
        reading = app.cleanup.target(POLICY).reading
        assert how in reading and "([database] timestamp_zone America/Chicago does not apply)" in (
            reading
        )
        run_at(app, datetime(2026, 1, 15, 12, 0, 1, tzinfo=UTC))  # read as UTC: expired
    finally:
        app.close()
    assert db.ids() == set()


def test_a_zone_stated_for_epoch_numbers_is_refused(sqlite_url: str, apps: Apps) -> None:
    db = Db(sqlite_url)
    try:
        db.execute("create table sessions (id integer primary key, expires_at integer)")
        db.execute("insert into sessions values (1, 1790000000)")
        app = apps(sqlite_url, {"where": None, "timestamp_zone": CHICAGO})
        assert app.cleanup is not None
        with pytest.raises(SchemaError, match="holds epoch seconds, which are UTC by definition"):
            app.cleanup.check()
    finally:
        db.close()


def test_naive_and_suffixed_iso_text_are_refused_once_a_zone_applies(
    sqlite_url: str, apps: Apps
) -> None:
    db = Db(sqlite_url)
    try:
        db.execute("create table sessions (id integer primary key, expires_at text)")
        db.execute("create index sessions_expires_at on sessions (expires_at)")
        db.execute(
            "insert into sessions values (1, '2026-01-15 12:00:00'), (2, '2026-01-15 13:00:00Z')"
        )
        app = apps(sqlite_url, {"where": None, "timestamp_zone": CHICAGO})
        assert app.cleanup is not None
        with pytest.raises(SchemaError, match="holds 1 times without a zone suffix and 1 with one"):
            app.cleanup.check()
        as_utc = apps(sqlite_url, {"where": None})  # both UTC: they sort together
        assert as_utc.cleanup is not None and as_utc.cleanup.check() == []
    finally:
        db.close()


@pytest.mark.parametrize("field", ["policy", "database"])
def test_a_timestamp_zone_that_is_not_an_iana_zone_is_refused(field: str) -> None:
    from expiry.config import parse_config

    data = config_data("sqlite:///unused.db")
    place = data["policy"][0] if field == "policy" else data["database"]
    place["timestamp_zone"] = "Central Time"
    where = f"policy {POLICY!r}" if field == "policy" else "[database]"
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert f"{where}: field 'timestamp_zone': 'Central Time' is not an IANA time zone" in str(
        caught.value
    )


# -- the bound, by brute force -------------------------------------------------------------------

CHANGES = [
    ("America/Chicago", "2025-11-02T05:00:00"),
    ("America/Chicago", "2026-03-08T06:00:00"),
    ("Europe/Paris", "2025-10-26T00:00:00"),
    ("Europe/Paris", "2026-03-29T00:00:00"),
    ("Australia/Lord_Howe", "2026-04-04T14:00:00"),  # back half an hour
    ("Pacific/Apia", "2011-12-29T08:00:00"),  # a whole day skipped
]


@pytest.mark.parametrize(("zone", "start"), CHANGES)
def test_the_bound_is_the_earliest_wall_clock_time_not_yet_expired(zone: str, start: str) -> None:
    """For cutoffs every 7 minutes across a change: every wall-clock time (to the
    second, every 61 s) below the bound has both readings before the cutoff, and
    the bound itself does not (so it is the tightest single comparison)."""
    tz = zone_of(zone)
    for minute in range(0, 5 * 60, 7):
        cutoff = z(start) + timedelta(minutes=minute, seconds=13)
        bound = wall_bound(cutoff, zone)
        assert latest_instant(bound, tz) >= cutoff
        wall = bound - timedelta(hours=26)
        while wall < bound:
            readings = [wall.replace(tzinfo=tz, fold=f).astimezone(UTC) for f in (0, 1)]
            assert all(r < cutoff for r in readings), (zone, cutoff, bound, wall)
            wall += timedelta(seconds=61)


def test_a_storage_carries_its_zone_through_its_token() -> None:
    storage = Storage("iso", "T", "", CHICAGO)
    assert storage.token == "iso:T:utc@America/Chicago"
    assert Storage.from_token(storage.token) == storage
    assert Storage.from_token("native@Europe/Paris") == Storage("native", zone="Europe/Paris")
    assert Storage.from_token("iso:space:+02:00") == Storage("iso", " ", "+02:00")
    with pytest.raises(ValueError, match="not an IANA time zone"):
        Storage.from_token("native@Mars/Olympus")
    # read back: the later reading of a repeated hour
    assert storage.read("2025-11-02T01:30:00") == z("2025-11-02T07:30:00")
    assert storage.read(datetime(2025, 11, 2, 1, 30)) == z("2025-11-02T07:30:00")
    assert Storage("iso").read("2025-11-02T01:30:00") == z("2025-11-02T01:30:00")


def test_a_partition_of_naive_local_times_is_dropped_once_its_range_has_passed_there(
    pg_db: Db, apps: Apps
) -> None:
    """A day partition of Chicago wall-clock times ends at local midnight, which
    is 06:00Z: read as UTC it would be dropped six hours early, live rows and all."""
    db = pg_db
    db.execute(
        "create table events (id bigint not null, created_at timestamp not null)"
        " partition by range (created_at)"
    )
    db.execute("create index events_created_at on events (created_at)")
    for day in (14, 15):
        db.execute(
            f"create table events_{day} partition of events"
            f" for values from ('2026-01-{day}') to ('2026-01-{day + 1}')"
        )
    walls = ["2026-01-14 22:00", "2026-01-14 23:00", "2026-01-14 23:45", "2026-01-15 00:30"]
    for i, wall in enumerate(walls, 1):
        db.execute("insert into events values (%s, %s)", [i, datetime.fromisoformat(wall)])
    policy = {"table": "events", "key": "id", "timestamp": "created_at", "where": None}
    app = apps(db.url, policy | {"timestamp_zone": CHICAGO, "window": 2})
    assert app.cleanup is not None

    before_midnight = z("2026-01-15T05:30:00")  # 23:30 CST on the 14th
    assert app.cleanup.preview(POLICY, before_midnight).partitions == []
    run_at(app, before_midnight)
    assert db.ids("events") == {3, 4}

    after_midnight = z("2026-01-15T06:00:01")
    [part] = app.cleanup.preview(POLICY, after_midnight).partitions
    assert part["partition"] == "public.events_14"
    run_at(app, after_midnight)
    assert db.ids("events") == {4}
    assert db.scalar("select to_regclass('events_14')") is None  # dropped whole
