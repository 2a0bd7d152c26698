"""Timestamps as applications store them: each storage cleans exactly its
expired rows; a column that could be misread is refused with the counts and
the fix, and nothing is deleted; a row written in another storage after the
planner read the column is never deleted (the guard in the statement); a run
whose predicate would take a live row stops at its sample check."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest

from expiry.app import App
from expiry.errors import SchemaError

from ._support import Db, claim_plan, drain, run_worker

Apps = Callable[..., App]
POLICY = "expired-sessions"
OFFSETS = (-3 * 86400.0, -3600.0, -1.0, 3600.0, 3 * 86400.0, 40 * 86400.0)
"""Seconds from now: the first three have expired, the rest have not."""

UNIX = datetime(1970, 1, 1, tzinfo=UTC)
PLUS_TWO = timezone(timedelta(hours=2))


def epoch(t: datetime) -> int:
    return int((t - UNIX).total_seconds())


def iso(t: datetime, sep: str = " ", suffix: str = "", fraction: bool = False) -> str:
    text = t.strftime(f"%Y-%m-%d{sep}%H:%M:%S")
    return text + (f".{t.microsecond:06d}" if fraction else "") + suffix


SQLITE_STORAGES: dict[str, tuple[str, Callable[[datetime], Any]]] = {
    # declared type, and how the app writes an instant
    "DATETIME epoch seconds": ("DATETIME", epoch),
    "TIMESTAMP epoch seconds": ("TIMESTAMP", epoch),
    "DATE epoch seconds": ("DATE", epoch),
    "untyped epoch seconds (real)": ("", lambda t: (t - UNIX).total_seconds()),
    "INTEGER epoch milliseconds": ("INTEGER", lambda t: epoch(t) * 1000 + t.microsecond // 1000),
    "REAL julianday": ("REAL", lambda t: (t - UNIX).total_seconds() / 86400 + 2440587.5),
    "TEXT iso T and Z": ("TEXT", lambda t: iso(t, "T", "Z")),
    "DATETIME iso space": ("DATETIME", iso),
    "TEXT iso with fractions": ("TEXT", lambda t: iso(t, " ", fraction=True)),
    "TEXT iso +02:00": ("TEXT", lambda t: iso(t.astimezone(PLUS_TWO), "T", "+02:00")),
}


def now_utc() -> datetime:
    return datetime.now(UTC)


def sqlite_table(db: Db, declared: str, values: list[Any]) -> None:
    db.execute(
        f"create table sessions (id integer primary key, expires_at {declared},"
        " revoked_at real, user_id integer not null default 0)"
    )
    db.execute("create index sessions_expires_at on sessions (expires_at)")
    for i, value in enumerate(values, 1):
        db.execute("insert into sessions (id, expires_at) values (%s, %s)", [i, value])


def remaining(db: Db) -> set[int]:
    return db.ids()


def run_once(app: App) -> str:
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    drain(app)
    return opened.run_id


@pytest.fixture
def sqlite_db(sqlite_url: str) -> Any:
    conn = Db(sqlite_url)
    yield conn
    conn.close()


@pytest.mark.parametrize("case", list(SQLITE_STORAGES))
def test_each_sqlite_storage_cleans_exactly_the_expired_rows(
    sqlite_db: Db, apps: Apps, case: str
) -> None:
    declared, write = SQLITE_STORAGES[case]
    now = now_utc()
    sqlite_table(sqlite_db, declared, [write(now + timedelta(seconds=s)) for s in OFFSETS])
    app = apps(sqlite_db.url, {"where": None})
    run_once(app)
    assert remaining(sqlite_db) == {4, 5, 6}, case


def test_dates_alone_expire_at_their_midnight(sqlite_db: Db, apps: Apps) -> None:
    today = now_utc().date()
    days = [today - timedelta(days=2), today - timedelta(days=1), today + timedelta(days=1)]
    sqlite_table(sqlite_db, "DATE", [d.isoformat() for d in days])
    run_once(apps(sqlite_db.url, {"where": None}))
    assert remaining(sqlite_db) == {3}


@pytest.mark.parametrize(
    ("values", "fragments"),
    [
        pytest.param(
            "mixed",
            ["mixes storage classes (3 integer, 3 text values)", 'where = "typeof(expires_at)'],
            id="integers and ISO text",
        ),
        pytest.param(
            "spellings",
            ["spells times two ways (3 with ' ', 3 with 'T'", "replace(expires_at, 'T', ' ')"],
            id="two ISO spellings",
        ),
        pytest.param(
            "units",
            [
                "which are not all of one format",
                "convert the rows to one format",
                'where = "expires_at >= 100000000000 and expires_at < 100000000000000"',
            ],
            id="epoch seconds and milliseconds",
        ),
        pytest.param(
            "sentinel",
            ["from 0 to", 'where = "expires_at >= 100000000 and expires_at < 100000000000"'],
            id="a zero sentinel",
        ),
        pytest.param(
            "words", ["text values that are not ISO-8601 times", "'never'"], id="unreadable text"
        ),
    ],
)
def test_a_column_that_could_be_misread_is_refused(
    sqlite_db: Db, apps: Apps, values: str, fragments: list[str]
) -> None:
    now = now_utc()
    times = [now + timedelta(seconds=s) for s in OFFSETS]
    data: list[Any] = {
        "mixed": [epoch(t) for t in times[:3]] + [iso(t) for t in times[3:]],
        "spellings": [iso(t, "T", "Z") for t in times[:3]] + [iso(t) for t in times[3:]],
        "units": [epoch(t) for t in times[:3]] + [epoch(t) * 1000 for t in times[3:]],
        "sentinel": [0] + [epoch(t) for t in times],
        "words": [iso(t) for t in times] + ["never"],
    }[values]
    sqlite_table(sqlite_db, "DATETIME", data)
    app = apps(sqlite_db.url, {"where": None})
    assert app.cleanup is not None
    with pytest.raises(SchemaError) as caught:
        app.cleanup.check()
    message = str(caught.value)
    assert message.startswith("policy 'expired-sessions': timestamp column 'expires_at'")
    assert "nothing is deleted while it could be misread. Fix: " in message
    for fragment in fragments:
        assert fragment in message, message
    with pytest.raises(SchemaError):
        app.cleanup.open_run(POLICY)
    assert len(remaining(sqlite_db)) == len(data)
    # A where the fix suggests is one the same check accepts.
    suggested = re.search(r'where = "(.*?)"', message)
    if suggested is not None:
        fixed = apps(sqlite_db.url, {"where": suggested.group(1)})
        assert fixed.cleanup is not None
        fixed.cleanup.check()


def test_a_stated_format_that_the_data_contradicts_is_refused(sqlite_db: Db, apps: Apps) -> None:
    now = now_utc()
    sqlite_table(sqlite_db, "INTEGER", [epoch(now + timedelta(seconds=s)) for s in OFFSETS])
    app = apps(sqlite_db.url, {"where": None, "timestamp_format": "epoch_ms"})
    assert app.cleanup is not None
    with pytest.raises(SchemaError, match="look like epoch seconds, but the policy states"):
        app.cleanup.check()


def test_a_stated_format_that_fits_is_used(sqlite_db: Db, apps: Apps) -> None:
    now = now_utc()
    sqlite_table(sqlite_db, "INTEGER", [epoch(now + timedelta(seconds=s)) * 1000 for s in OFFSETS])
    app = apps(sqlite_db.url, {"where": None, "timestamp_format": "epoch_ms"})
    run_once(app)
    assert remaining(sqlite_db) == {4, 5, 6}


def test_a_where_can_set_the_misread_rows_aside(sqlite_db: Db, apps: Apps) -> None:
    """The refusal's fix works: the detection reads only the rows the policy covers."""
    now = now_utc()
    times = [now + timedelta(seconds=s) for s in OFFSETS]
    sqlite_table(sqlite_db, "DATETIME", [epoch(t) for t in times] + [iso(times[0])])
    run_once(apps(sqlite_db.url, {"where": "typeof(expires_at) = 'integer'"}))
    assert remaining(sqlite_db) == {4, 5, 6, 7}


def test_a_column_that_changed_since_the_check_stops_the_run_before_deleting(
    sqlite_db: Db, apps: Apps
) -> None:
    now = now_utc()
    times = [now + timedelta(seconds=s) for s in OFFSETS]
    sqlite_table(sqlite_db, "DATETIME", [epoch(t) for t in times])
    app = apps(sqlite_db.url, {"where": None})
    assert app.cleanup is not None
    app.cleanup.check()  # read as epoch seconds
    sqlite_db.execute("update sessions set expires_at = expires_at * 1000 where id > 3")
    opened = app.cleanup.open_run(POLICY)  # the process's check is cached; the run reads again
    drain(app)
    plan = sqlite_db.jobs("expiry.plan", opened.run_id)
    assert [j["state"] for j in plan] == ["dead"]
    assert "not all of one format" in plan[0]["error"]
    assert remaining(sqlite_db) == {1, 2, 3, 4, 5, 6}


HOSTILE = {
    # storage as planned, and values written afterwards in another storage that
    # the index bound admits but that are not expired (or not readable as such)
    "DATETIME epoch seconds": ("DATETIME", epoch, [2461000.5, "2000-01-01 00:00:00"]),
    # Numeric and no affinity compare without typeof() in the guard (a text or
    # blob value sorts above every number): text written there is never taken.
    "REAL epoch seconds": ("REAL", epoch, []),
    "untyped epoch seconds": ("", epoch, []),
    "TEXT iso T and Z": ("TEXT", lambda t: iso(t, "T", "Z"), ["later", 1000]),
    # A fixed +02:00 column: values in another offset an hour ahead sort below the
    # cutoff's text; only the guard, comparing instants at the cutoff's own
    # offset, keeps them (dropping the offset from it moves it two hours late).
    "TEXT iso +02:00": ("TEXT", lambda t: iso(t.astimezone(PLUS_TWO), "T", "+02:00"), []),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_row_written_in_another_storage_after_planning_is_never_deleted(
    sqlite_db: Db, apps: Apps, case: str
) -> None:
    declared, write, _ = HOSTILE[case]
    now = now_utc()
    sqlite_table(sqlite_db, declared, [write(now + timedelta(seconds=s)) for s in OFFSETS])
    app = apps(sqlite_db.url, {"where": None})
    assert app.cleanup is not None
    app.cleanup.open_run(POLICY)
    claim_plan(app)
    later = now + timedelta(hours=5)
    hostile: list[Any] = (
        [2461000.5 + 400.0, iso(later)]  # a julianday far ahead; ISO text later today
        if declared in ("DATETIME", "REAL", "")
        else [epoch(later), iso(later)]  # an epoch number; the other spelling, later today
    )
    if declared == "":  # no affinity: an expired time's digits stay text, not a number
        hostile.append(str(epoch(now - timedelta(hours=1))))
    if case == "TEXT iso +02:00":
        soon = now + timedelta(hours=1)  # live for an hour, spelled in UTC and at -05:00
        minus_five = timezone(timedelta(hours=-5))
        hostile = [iso(soon, "T", "Z"), iso(soon.astimezone(minus_five), "T", "-05:00")]
    for i, value in enumerate(hostile, 2):  # inside the planned windows' key range
        sqlite_db.execute("update sessions set expires_at = %s where id = %s", [value, i])
    run_worker(app)
    assert remaining(sqlite_db) == {2, 3, 4, 5, 6}


PG_STORAGES: dict[str, tuple[str, Callable[[datetime], Any], dict[str, Any]]] = {
    "timestamp without time zone": ("timestamp", lambda t: t.replace(tzinfo=None), {}),
    "bigint epoch seconds": ("bigint", epoch, {}),
    "bigint epoch ms, stated": (
        "bigint",
        lambda t: epoch(t) * 1000,
        {"timestamp_format": "epoch_ms"},
    ),
    "integer epoch seconds, stated": ("integer", epoch, {"timestamp_format": "epoch"}),
}


@pytest.mark.parametrize("case", list(PG_STORAGES))
def test_each_postgres_storage_cleans_exactly_the_expired_rows(
    pg_db: Db, apps: Apps, case: str
) -> None:
    declared, write, policy = PG_STORAGES[case]
    now = now_utc()
    pg_db.execute(
        f"create table sessions (id bigint primary key, expires_at {declared},"
        " revoked_at timestamptz)"
    )
    pg_db.execute("create index on sessions (expires_at)")
    for i, s in enumerate(OFFSETS, 1):
        pg_db.execute(
            "insert into sessions (id, expires_at) values (%s, %s)",
            [i, write(now + timedelta(seconds=s))],
        )
    run_once(apps(pg_db.url, policy))
    assert pg_db.ids() == {4, 5, 6}, case


def test_a_postgres_date_expires_at_its_midnight_utc(pg_db: Db, apps: Apps) -> None:
    today = now_utc().date()
    pg_db.execute(
        "create table sessions (id bigint primary key, expires_at date, revoked_at timestamptz)"
    )
    for i, d in enumerate([today - timedelta(days=1), today, today + timedelta(days=1)], 1):
        pg_db.execute("insert into sessions (id, expires_at) values (%s, %s)", [i, d])
    run_once(apps(pg_db.url))
    # today's midnight has passed (unless the test runs in its very first second)
    assert pg_db.ids() == {3}


def test_postgres_integers_in_the_julianday_range_are_refused(pg_db: Db, apps: Apps) -> None:
    pg_db.execute(
        "create table sessions (id bigint primary key, expires_at bigint, revoked_at timestamptz)"
    )
    pg_db.execute("insert into sessions values (1, 2461000, null), (2, 2461010, null)")
    app = apps(pg_db.url)
    assert app.cleanup is not None
    with pytest.raises(SchemaError, match="neither epoch seconds"):
        app.cleanup.check()
    with pytest.raises(SchemaError):
        app.cleanup.open_run(POLICY)
    assert pg_db.ids() == {1, 2}


def test_a_postgres_epoch_column_out_of_every_range_is_refused(pg_db: Db, apps: Apps) -> None:
    pg_db.execute(
        "create table sessions (id bigint primary key, expires_at bigint, revoked_at timestamptz)"
    )
    pg_db.execute("insert into sessions values (1, 0, null), (2, 1790000000, null)")
    app = apps(pg_db.url)
    assert app.cleanup is not None
    with pytest.raises(SchemaError, match="not all of one format"):
        app.cleanup.check()


@pytest.mark.parametrize(
    ("ddl", "fragment"),
    [
        pytest.param(
            "create view sessions as select s.* from sessions_base s"
            " join users u on u.id = s.user_id",
            "is a view, which expiry cannot delete from",
            id="join view",
        ),
        pytest.param(
            "create materialized view sessions as select * from sessions_base",
            "is a materialized view, which expiry cannot delete from",
            id="materialized view",
        ),
    ],
)
def test_a_target_expiry_cannot_delete_from_is_refused(
    pg_db: Db, apps: Apps, ddl: str, fragment: str
) -> None:
    pg_db.execute(
        "create table sessions_base (id bigint primary key, user_id int,"
        " expires_at timestamptz, revoked_at timestamptz)"
    )
    pg_db.execute("create table users (id int primary key)")
    pg_db.execute(ddl)
    app = apps(pg_db.url)
    assert app.cleanup is not None
    with pytest.raises(SchemaError, match=fragment):
        app.cleanup.check()


def test_a_simple_view_can_be_cleaned(pg_db: Db, apps: Apps) -> None:
    """An automatically updatable view is a table to delete from."""
    pg_db.create_sessions("sessions_base")
    pg_db.execute("create view sessions as select * from sessions_base where user_id >= 0")
    pg_db.insert_sessions([(1, -3600.0, False), (2, 3600.0, False)], "sessions_base")
    app = apps(pg_db.url)
    assert app.cleanup is not None
    # Its table's indexes serve it: no index is advised on the view itself.
    warnings = app.cleanup.check()
    notes = app.cleanup.target("expired-sessions").notes
    assert not [w for w in warnings + notes if "create index on sessions" in w], warnings + notes
    assert any("sessions is a view" in n and "none can be created on a view" in n for n in notes)
    run_once(app)
    assert pg_db.ids("sessions_base") == {2}


def test_a_foreign_table_is_refused(pg_db: Db, apps: Apps) -> None:
    pg_db.execute("create extension if not exists postgres_fdw")
    pg_db.execute("create server elsewhere foreign data wrapper postgres_fdw")
    pg_db.execute(
        "create foreign table sessions (id bigint, expires_at timestamptz,"
        " revoked_at timestamptz) server elsewhere"
    )
    app = apps(pg_db.url)
    assert app.cleanup is not None
    with pytest.raises(SchemaError, match="is a foreign table: its rows live in another database"):
        app.cleanup.check()


def test_expirys_own_tables_are_refused(db: Db, apps: Apps) -> None:
    own = "expiry.jobs" if db.dialect == "postgres" else "expiry_jobs"
    app = apps(db.url, {"table": own, "key": "id", "timestamp": "run_at", "where": None})
    assert app.cleanup is not None
    with pytest.raises(SchemaError, match="is one of expiry's own tables"):
        app.cleanup.check()
    archive = "expiry.audit" if db.dialect == "postgres" else "expiry_audit"
    db.create_sessions()
    app = apps(db.url, {"action": "archive", "archive_table": archive})
    assert app.cleanup is not None
    with pytest.raises(SchemaError, match=f"archive_table '{archive}' is one of expiry's own"):
        app.cleanup.check()


def test_a_sqlite_view_is_refused(sqlite_db: Db, apps: Apps) -> None:
    sqlite_db.create_sessions("sessions_base")
    sqlite_db.execute("create view sessions as select * from sessions_base")
    app = apps(sqlite_db.url)
    assert app.cleanup is not None
    with pytest.raises(SchemaError, match="is a view, which expiry cannot delete from"):
        app.cleanup.check()


def test_the_sample_check_stops_a_run_whose_predicate_takes_live_rows(
    db: Db, apps: Apps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted bug: the predicate compares with a cutoff ten days later. The
    run's sample check reads the candidates in Python and stops it before its
    first window: nothing is deleted, the planning job is dead with the reason."""
    engine_class = type(app_engine(db.url))
    predicate = engine_class.time_predicate

    def later(self: Any, storage: Any, declared: str | None = None) -> tuple[str, str]:
        bound, guard = predicate(self, storage, declared)
        shift = {"postgres": "interval '10 days'", "sqlite": "864000", "mysql": "interval 10 day"}[
            self.dialect
        ]
        return f"({bound} + {shift})", guard

    monkeypatch.setattr(engine_class, "time_predicate", later)
    db.create_sessions()
    db.insert_sessions([(1, -3600.0, False), (2, 86400.0, False), (3, 2 * 86400.0, False)])
    app = apps(db.url, {"where": None})
    run_id = run_once(app)
    plan = db.jobs("expiry.plan", run_id)
    assert [j["state"] for j in plan] == ["dead"]
    assert "stopped before deleting anything" in plan[0]["error"]
    assert "not before the cutoff" in plan[0]["error"]
    assert db.ids() == {1, 2, 3}
    assert db.windows(run_id) == []


def app_engine(url: str) -> Any:
    from expiry.engines import open_engine

    engine = open_engine(url)
    engine.close()
    return engine


def test_python_reads_stored_values_independently() -> None:
    from expiry.timestamps import instant

    t = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert instant(epoch(t)) == t
    assert instant(epoch(t) * 1000) == t
    assert instant(epoch(t) / 86400 + 2440587.5) == t
    assert instant("2026-11-30T14:00:00+02:00") == t
    assert instant("2026-11-30 12:00:00") == t
    assert instant(date(2026, 11, 30)) == t - timedelta(hours=12)
    assert instant(0) is None
    assert instant("never") is None


@pytest.mark.parametrize("stated", [True, False])
def test_a_zero_in_a_stated_epoch_column_is_the_epoch_itself(
    db: Db, apps: Apps, stated: bool
) -> None:
    """Nextcloud's oc_authtoken.last_activity defaults to 0. With timestamp_format
    = "epoch" stated, 0 is 1970-01-01: expired, deleted with the other expired
    rows (Nextcloud's own rule deletes them); unstated, a 0 is no epoch second
    and the policy is refused with nothing deleted."""
    db.execute("create table tokens (id bigint primary key, last_activity bigint not null)")
    db.execute("create index tokens_last_activity on tokens (last_activity)")
    now = epoch(now_utc())
    values = {1: 0, 2: 0, 3: now - 86400, 4: now - 3600, 5: now + 3600, 6: now + 86400}
    for key, value in values.items():
        db.execute("insert into tokens (id, last_activity) values (%s, %s)", [key, value])
    policy = {"table": "tokens", "timestamp": "last_activity", "where": None}
    app = apps(db.url, {**policy, "timestamp_format": "epoch"} if stated else policy)
    assert app.cleanup is not None
    if not stated:
        with pytest.raises(SchemaError, match="not all of one format"):
            app.cleanup.open_run(POLICY)
        assert db.ids("tokens") == set(values)
        return
    preview = app.cleanup.preview(POLICY)
    assert preview.candidates == 4
    assert "0 is the epoch itself" in preview.storage
    opened = app.cleanup.open_run(POLICY)
    drain(app)
    assert db.ids("tokens") == {5, 6}
    assert sum(row["rows"] for row in db.ledger(opened.run_id)) == 4


@pytest.mark.parametrize("storage", ["epoch", "iso"])
def test_sqlite_key_windows_scan_the_key_not_the_timestamps_index(
    sqlite_db: Db, apps: Apps, storage: str
) -> None:
    """A key window's statement, and the planner's walk along the key, read the
    key's range: SQLite would otherwise take the timestamp's index for the
    cutoff and an epoch column's guard, every expired row of the table for each
    window (0.14x the hand-written loop at 2,000,000 rows; 0.54x with the key)."""
    from expiry.cleanup.sql import DELETE, PLAN_PAGE

    sqlite_db.create_sessions()
    # Expired and live rows interleaved, 4 in 5 expired, as sessions are.
    seconds = (
        "unixepoch('now') + case when (i * 761) % 1000 < 800 then -1 else 1 end * (1 + i % 86400)"
    )
    value = f"datetime({seconds}, 'unixepoch')" if storage == "iso" else f"{seconds} + 0.5"
    sqlite_db.conn.execute(
        "insert into sessions (id, expires_at) with recursive s(i) as (select 1 union all"
        f" select i + 1 from s where i < 20000) select i, {value} from s"
    )
    sqlite_db.conn.execute("analyze")  # the statistics that make the planner prefer the index
    app = apps(sqlite_db.url, {"windows": "key", "where": None})
    assert app.cleanup is not None
    target = app.cleanup.target(POLICY)  # checked: the column's storage read
    for template in (DELETE, PLAN_PAGE):
        text = target.text(template)
        found = sqlite_db.conn.execute("explain query plan " + text, _params(text)).fetchall()
        plan = " ".join(str(row[3]) for row in found)
        assert "INTEGER PRIMARY KEY" in plan and "sessions_expires_at" not in plan, (text, plan)


def _params(text: str) -> dict[str, Any]:
    """Every named parameter of a statement, bound to a value of no consequence."""
    return {name: 0 for name in re.findall(r":(\w+)", text)}
