"""Tables real applications have: Django's sessions (a varchar key), UUID and
composite keys, random 62-bit ids, partitioned tables (PostgreSQL only: SQLite
has no partitions), and tables referenced under RESTRICT or CASCADE.

Each test counts the rows with SQL after the run, against the rows it inserted
as expired or live (its own oracle, never asking expiry); the Django test also
kills a worker process mid-run and redelivers completed windows.
"""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from expiry.app import App
from expiry.cleanup.runs import PARTITION
from expiry.errors import SchemaError

from ._support import (
    LIVE,
    Db,
    assert_run_clean,
    cli,
    cli_env,
    drain,
    expiry_cmd,
    wait_for,
    write_config,
)

Apps = Callable[..., App]
POLICY = "expired-sessions"

DJANGO_DDL = {
    # django.contrib.sessions' migration 0001 as Django 4.2 writes it on each database.
    "postgres": [
        'CREATE TABLE "django_session" ("session_key" varchar(40) NOT NULL PRIMARY KEY,'
        ' "session_data" text NOT NULL, "expire_date" timestamp with time zone NOT NULL)',
        'CREATE INDEX "django_session_expire_date_a5c62663" ON "django_session" ("expire_date")',
        'CREATE INDEX "django_session_session_key_c0390e0f_like" ON "django_session"'
        ' ("session_key" varchar_pattern_ops)',
    ],
    # Django's MySQL backend (USE_TZ: UTC in a datetime(6)).
    "mysql": [
        "CREATE TABLE `django_session` (`session_key` varchar(40) NOT NULL PRIMARY KEY,"
        " `session_data` longtext NOT NULL, `expire_date` datetime(6) NOT NULL)",
        "CREATE INDEX `django_session_expire_date_a5c62663` ON `django_session` (`expire_date`)",
    ],
    "sqlite": [
        'CREATE TABLE "django_session" ("session_key" varchar(40) NOT NULL PRIMARY KEY,'
        ' "session_data" text NOT NULL, "expire_date" datetime NOT NULL)',
        'CREATE INDEX "django_session_expire_date_a5c62663" ON "django_session" ("expire_date")',
    ],
}
DJANGO = {
    "table": "django_session",
    "key": "session_key",
    "timestamp": "expire_date",
    "where": None,
    "window": 7,
    "nice_ratio": 0,
}


def stamp(db: Db, when: datetime) -> Any:
    """A time as Django stores it: timestamptz on PostgreSQL, UTC text on SQLite,
    a UTC datetime(6) on MySQL."""
    if db.dialect == "mysql":
        return when.astimezone(UTC).replace(tzinfo=None)
    return (
        when if db.dialect == "postgres" else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    )


def now_of(db: Db) -> datetime:
    if db.dialect == "postgres":
        value: datetime = db.scalar("select now()")
        return value
    if db.dialect == "mysql":
        return datetime(*db.scalar("select utc_timestamp(6)").timetuple()[:6], tzinfo=UTC)
    return datetime.fromtimestamp(float(db.scalar("select {now}")), UTC)


def session_rows(db: Db, n: int, seed: int) -> tuple[list[tuple[str, str, Any]], set[str]]:
    """``n`` sessions, 40% expired an hour ago; timestamps repeat (sessions
    created in one request share one), so ties cross window bounds."""
    rng = random.Random(seed)
    now = now_of(db)
    rows, expired = [], set()
    for i in range(n):
        key = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(32))
        if i % 5 < 2:
            when = now - timedelta(hours=1, seconds=rng.choice([0, 1, 2, 3]))
            expired.add(key)
        else:
            when = now + timedelta(days=1, seconds=rng.choice([0, 1]))
        rows.append((key, f"data {i}", stamp(db, when)))
    return rows, expired


def insert(db: Db, table: str, columns: str, rows: list[tuple[Any, ...]]) -> None:
    marks = ", ".join(["%s"] * len(rows[0]))
    statement = db.sql(f"insert into {table} ({columns}) values ({marks})")
    if db.dialect == "postgres":
        with db.conn.cursor() as cur:
            cur.executemany(statement, rows)
    elif db.dialect == "mysql":
        db.conn.executemany(statement, rows)
    else:
        db.conn.execute("begin")
        db.conn.executemany(statement, rows)
        db.conn.execute("commit")


def keys_of(db: Db, table: str, key: str) -> set[str]:
    return {str(r[0]) for r in db.rows(f"select {key} from {table}")}


def window_jobs(db: Db, run_id: str) -> list[dict[str, Any]]:
    return db.windows(run_id)


def test_django_sessions_with_a_worker_killed_and_redeliveries(
    db: Db, apps: Apps, tmp_path: Path
) -> None:
    for statement in DJANGO_DDL[db.dialect]:
        db.execute(statement)
    if db.dialect == "postgres":  # no statistics: block windows stay out of this test
        db.execute("alter table django_session set (autovacuum_enabled = false)")
    rows, expired = session_rows(db, 400, seed=7)
    insert(db, "django_session", "session_key, session_data, expire_date", rows)
    everything = {r[0] for r in rows}

    # check says which windows and why, without a schema change.
    config = write_config(tmp_path / "expiry.toml", db.url, DJANGO, worker={"lease": "2s"})
    checked = cli("--config", str(config), "--json", "check", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    notes = json.loads(checked.stdout)["notes"][POLICY]
    assert notes[0].startswith("time windows: key column 'session_key' is varchar(40)") or (
        notes[0].startswith("time windows: key column 'session_key' is character varying(40)")
    ), notes

    # A worker process cleans part of the run, resting between windows, and is killed.
    app = apps(db.url, {**DJANGO, "nice_ratio": 0})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    slow = write_config(
        tmp_path / "slow.toml",
        db.url,
        {**DJANGO, "max_rows_per_second": 40},
        worker={"lease": "2s"},
    )
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        expiry_cmd("--config", str(slow), "worker"), env=cli_env(), stdout=log, stderr=log
    )
    try:
        wait_for(lambda: len(db.ledger(opened.run_id)) >= 3, timeout=60, what="three windows")
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(10) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
        log.close()
    assert keys_of(db, "django_session", "session_key") != everything - expired  # mid-run

    drain(app, lease=2)
    assert keys_of(db, "django_session", "session_key") == everything - expired
    jobs = window_jobs(db, opened.run_id)
    assert all(j["payload"]["windows"] == "time" for j in jobs)
    assert len(jobs) == math.ceil(len(expired) / 7)  # windows follow the expired rows
    assert_run_clean(db, opened.run_id)

    # Redeliveries after the deleted rows are put back (still expired): no effect.
    insert(
        db,
        "django_session",
        "session_key, session_data, expire_date",
        [r for r in rows if r[0] in expired],
    )
    ledger = db.ledger(opened.run_id)
    for job in jobs[:3]:
        db.redeliver(job["key"])
    drain(app)
    assert keys_of(db, "django_session", "session_key") == everything
    assert db.ledger(opened.run_id) == ledger


def test_a_uuid_key_and_a_composite_key_get_time_windows(db: Db, apps: Apps) -> None:
    uuid_type = {"postgres": "uuid", "sqlite": "text", "mysql": "char(36)"}[db.dialect]
    ts = "datetime(6)" if db.dialect == "mysql" else "timestamp"
    db.execute(
        f"create table tokens (tenant_id integer not null, id {uuid_type} not null,"
        f" expires_at {ts} not null, primary key (tenant_id, id))"
    )
    db.execute("create index tokens_expires_at on tokens (expires_at)")
    now = now_of(db).replace(tzinfo=None)
    rows, expired = [], set()
    for i in range(150):
        key = str(uuid.uuid5(uuid.NAMESPACE_DNS, str(i)))
        late = i % 3 == 0
        when = now - timedelta(minutes=5) if late else now + timedelta(hours=1)
        rows.append((i % 4, key, when.isoformat(" ") if db.dialect == "sqlite" else when))
        if late:
            expired.add(key)
    insert(db, "tokens", "tenant_id, id, expires_at", rows)
    app = apps(
        db.url,
        {"table": "tokens", "key": "id", "timestamp": "expires_at", "where": None, "window": 9},
    )
    assert app.cleanup is not None
    app.cleanup.check()
    assert app.cleanup.target(POLICY).notes[0].startswith("time windows: key column 'id' is")
    opened = app.cleanup.open_run(POLICY)
    drain(app, concurrency=2)
    assert keys_of(db, "tokens", "id") == {r[1] for r in rows} - expired
    assert len(window_jobs(db, opened.run_id)) == math.ceil(len(expired) / 9)
    assert_run_clean(db, opened.run_id)


def test_random_ids_plan_one_window_per_window_of_expired_rows(db: Db, apps: Apps) -> None:
    db.create_sessions()
    rng = random.Random(3)
    ids = rng.sample(range(1, 2**62), 600)
    rows = [(i, -3600.0 if n % 10 == 0 else 86_400.0, False) for n, i in enumerate(ids)]
    db.insert_sessions(rows)
    expired = {i for i, off, _ in rows if off < 0}
    app = apps(db.url, {"where": None, "window": 25})
    assert app.cleanup is not None
    preview = app.cleanup.preview(POLICY)
    assert preview.strategy.startswith("time windows: expired keys are sparse"), preview.strategy
    opened = app.cleanup.open_run(POLICY)
    drain(app)
    assert db.ids() == set(ids) - expired
    jobs = window_jobs(db, opened.run_id)
    assert len(jobs) == math.ceil(len(expired) / 25) == 3  # not 60 one-row key windows
    assert_run_clean(db, opened.run_id)


# -- partitions (PostgreSQL) --------------------------------------------------------


def create_events(db: Db, months: int = 12) -> tuple[datetime, list[str]]:
    """``events`` partitioned by month on created_at, the last two months ahead
    of now; 30 rows a partition. Returns the first month and the partitions."""
    first = datetime(2026, 1, 1, tzinfo=UTC)
    db.execute(
        "create table events (id bigint not null, created_at timestamptz not null, note text)"
        " partition by range (created_at)"
    )
    db.execute("create index events_created_at on events (created_at)")
    names = []
    for m in range(months):
        lo, hi = (
            first.replace(month=m + 1),
            (first.replace(month=m + 2) if m < 11 else first.replace(year=2027)),
        )
        name = f"events_{lo:%Y_%m}"
        db.execute(
            f"create table {name} partition of events for values from ('{lo.isoformat()}') to ('{hi.isoformat()}')"
        )
        db.execute(
            f"insert into {name} select g, %s::timestamptz + mod(g, 28) * interval '1 day', 'n'"
            " from generate_series(1, 30) g",
            [lo],
        )
        names.append(name)
    db.execute("analyze events")
    return first, names


EVENTS = {"table": "events", "key": "id", "timestamp": "created_at", "where": None, "window": 8}


@pytest.mark.parametrize("mode", ["auto", "detach", "rows"])
def test_expired_partitions_are_removed_whole(pg_db: Db, apps: Apps, mode: str) -> None:
    db = pg_db
    first, names = create_events(db)
    # The cutoff falls on 2026-11-10: ten partitions lie wholly before it.
    cutoff = datetime(2026, 11, 10, tzinfo=UTC)
    expected_left = int(db.scalar("select count(*) from events where created_at >= %s", [cutoff]))
    app = apps(db.url, {**EVENTS, "partitions": mode})
    assert app.cleanup is not None
    preview = app.cleanup.preview(POLICY, cutoff)
    dropped = [] if mode == "rows" else names[:10]
    assert [p["partition"] for p in preview.partitions] == [f"public.{n}" for n in dropped]
    opened = app.cleanup.open_run(POLICY, cutoff)
    drain(app, concurrency=2)

    assert int(db.scalar("select count(*) from events")) == expected_left
    assert int(db.scalar("select count(*) from events where created_at < %s", [cutoff])) == 0
    attached = {
        r[0]
        for r in db.rows(
            "select c.relname from pg_inherits i join pg_class c on c.oid = i.inhrelid where i.inhparent = 'events'::regclass"
        )
    }
    existing = {
        r[0]
        for r in db.rows(
            "select relname from pg_class where relname like 'events_2026%%' and relkind = 'r'"
        )
    }
    assert attached == set(names) - set(dropped)
    assert existing == (set(names) - set(dropped) if mode == "auto" else set(names))
    partition_jobs = db.jobs(PARTITION, opened.run_id)
    assert sorted(j["key"].rsplit(":", 1)[1] for j in partition_jobs) == sorted(
        f"public.{n}" for n in dropped
    )
    booked = [r for r in db.ledger(opened.run_id) if r["key"] in {j["key"] for j in partition_jobs}]
    assert len(booked) == len(dropped)
    assert db.run_state(opened.run_id) == "finished"
    assert {j["state"] for j in db.jobs(run_id=opened.run_id)} == {"completed"}
    if mode == "detach":
        # Detached, not dropped: the rows are all still there for archiving.
        assert sum(int(db.scalar(f"select count(*) from {n}")) for n in dropped) == 300


@pytest.mark.parametrize("mode", ["auto", "detach"])
def test_a_removed_partition_books_the_rows_it_held_not_the_estimate(
    pg_db: Db, apps: Apps, mode: str
) -> None:
    """The ledger is the evidence of deletion: a partition's rows are counted
    when it goes, whatever the planner's statistics say (here they are stale:
    rows deleted, added and never analyzed since the last ANALYZE)."""
    db = pg_db
    _, names = create_events(db)  # analyzed: 30 rows a partition
    db.execute("delete from events_2026_01 where id > 5")  # 5 left, estimate 30
    db.execute(
        "insert into events_2026_02 select g, '2026-02-03'::timestamptz, 'n'"
        " from generate_series(100, 1099) g"
    )  # 1,030, estimate 30
    db.execute(
        "create table events_2026_late partition of events"
        " for values from ('2025-06-01') to ('2026-01-01')"
    )
    db.execute(
        "insert into events_2026_late select g, '2025-07-01'::timestamptz, 'n'"
        " from generate_series(1, 12) g"
    )  # never analyzed
    cutoff = datetime(2026, 11, 10, tzinfo=UTC)
    expired = [*names[:10], "events_2026_late"]
    held = {n: int(db.scalar(f"select count(*) from {n}")) for n in expired}  # the oracle
    assert held["events_2026_01"] == 5 and held["events_2026_02"] == 1030
    app = apps(db.url, {**EVENTS, "partitions": mode})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY, cutoff)
    drain(app, concurrency=2)

    partition_jobs = {j["key"] for j in db.jobs(PARTITION, opened.run_id)}
    booked = {
        r["key"].rsplit(".", 1)[1]: int(r["rows"])
        for r in db.ledger(opened.run_id)
        if r["key"] in partition_jobs
    }
    assert booked == held
    summary = app.runs.summary(opened.run_id)
    assert summary is not None
    windows = sum(
        int(r["rows"]) for r in db.ledger(opened.run_id) if r["key"] not in partition_jobs
    )
    assert summary["rows_affected"] == sum(held.values()) + windows
    assert int(db.scalar("select count(*) from events where created_at < %s", [cutoff])) == 0


def test_a_partition_behind_a_long_read_waits_its_short_lock_timeout_and_spends_no_attempt(
    pg_db: Db, apps: Apps
) -> None:
    """A report holds the table (ACCESS SHARE) for seconds: each try to detach
    an expired partition waits partition_lock_timeout (50 ms here, not the
    policy's 2 s lock_timeout), so the application's own queries, queued behind
    the waiting detach, stall at most about that long; the tries spend no
    attempt (max_attempts = 2 and more lock timeouts than that: nothing dead),
    and once the read ends every expired partition goes, booked exactly."""
    db = pg_db
    create_events(db)
    cutoff = datetime(2026, 11, 10, tzinfo=UTC)
    held = int(db.scalar("select count(*) from events where created_at < %s", [cutoff]))
    app = apps(db.url, {**EVENTS, "max_attempts": 2, "partition_lock_timeout": "50ms"})
    assert app.cleanup is not None
    reader = psycopg.connect(db.url)
    reader.execute("select count(*) from events").fetchone()  # its transaction stays open
    stalls: list[float] = []
    done = threading.Event()

    def application() -> None:  # the app's reads, each 20 ms, as live traffic
        with psycopg.connect(db.url, autocommit=True) as conn:
            while not done.is_set():
                began = time.monotonic()
                conn.execute("select count(*) from events where created_at >= %s", [cutoff])
                stalls.append(time.monotonic() - began)
                time.sleep(0.02)

    traffic = threading.Thread(target=application)
    traffic.start()
    opened = app.cleanup.open_run(POLICY, cutoff)
    cleaning = threading.Thread(target=drain, args=(app,), kwargs={"timeout": 120})
    cleaning.start()
    try:
        # Hold the read until some partition's detach has waited out its lock
        # at least twice: with attempts spent, that job would be dead.
        def timeouts() -> int:
            return max(
                (
                    len([e for e in j["errors"] if e.get("kind") == "lock_timeout"])
                    for j in db.jobs(PARTITION, opened.run_id)
                ),
                default=0,
            )

        wait_for(lambda: timeouts() >= 3, timeout=60)
        assert {j["state"] for j in db.jobs(PARTITION, opened.run_id)} <= {
            "available",
            "retryable",
            "running",
        }
    finally:
        reader.rollback()
        reader.close()
    cleaning.join(timeout=150)
    done.set()
    traffic.join()
    assert not cleaning.is_alive()

    jobs = db.jobs(PARTITION, opened.run_id)
    assert len(jobs) == 10 and {j["state"] for j in jobs} == {"completed"}
    worst = max(stalls)
    assert worst < 1.0, f"the application waited {worst:.3f}s behind a detach"
    assert int(db.scalar("select count(*) from events where created_at < %s", [cutoff])) == 0
    booked = sum(int(r["rows"]) for r in db.ledger(opened.run_id))
    assert booked == held
    assert db.run_state(opened.run_id) == "finished"


def test_a_partition_that_ends_after_the_cutoff_is_cleaned_by_windows(
    pg_db: Db, apps: Apps
) -> None:
    db = pg_db
    create_events(db)
    cutoff = datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC)  # the November partition ends at 12-01
    app = apps(db.url, EVENTS)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY, cutoff)
    drain(app)
    assert int(db.scalar("select count(*) from events where created_at < %s", [cutoff])) == 0
    assert int(db.scalar("select count(*) from events_2026_11")) == 0  # emptied, not dropped
    assert len(db.jobs(PARTITION, opened.run_id)) == 10


# -- foreign keys -------------------------------------------------------------------


def test_half_expired_sessions_in_random_order_get_block_windows(pg_db: Db, apps: Apps) -> None:
    """PostgreSQL: half the table expired, the timestamp unrelated to the heap's
    order (by the planner's statistics): windows over the heap's blocks."""
    db = pg_db
    for statement in DJANGO_DDL["postgres"]:
        db.execute(statement)
    rows, expired = session_rows(db, 3000, seed=11)
    random.Random(5).shuffle(rows)
    insert(db, "django_session", "session_key, session_data, expire_date", rows)
    db.execute("vacuum analyze django_session")
    app = apps(db.url, {**DJANGO, "window": 100})
    assert app.cleanup is not None
    preview = app.cleanup.preview(POLICY)
    assert preview.strategy.startswith("block windows: key column 'session_key'"), preview.strategy
    assert "does not follow the heap" in preview.strategy
    opened = app.cleanup.open_run(POLICY)
    drain(app, concurrency=2)
    assert keys_of(db, "django_session", "session_key") == {r[0] for r in rows} - expired
    jobs = window_jobs(db, opened.run_id)
    assert all(j["payload"]["windows"] == "blocks" for j in jobs)
    assert 5 <= len(jobs) <= 3 * math.ceil(len(expired) / 100)  # about window rows each
    assert_run_clean(db, opened.run_id)
    # Redelivered after the rows are put back (still expired): no effect.
    insert(
        db,
        "django_session",
        "session_key, session_data, expire_date",
        [r for r in rows if r[0] in expired],
    )
    ledger = db.ledger(opened.run_id)
    for job in jobs[:3]:
        db.redeliver(job["key"])
    drain(app)
    assert keys_of(db, "django_session", "session_key") == {r[0] for r in rows}
    assert db.ledger(opened.run_id) == ledger


@pytest.mark.parametrize("layout", ["interleaved", "oldest-third"])
def test_dense_keys_across_the_whole_table_get_block_windows(
    pg_db: Db, apps: Apps, layout: str
) -> None:
    """PostgreSQL, an analyzed table with a bigint key in heap order: expired
    keys dense across the whole table (four rows in five, interleaved) take
    block windows, which read the same pages without the key's index (the planner's
    estimate says so, no exact count needed); dense
    but only in the oldest third of the keys, key windows (blocks would read
    the whole heap). The oracle: exactly the expired rows go, either way."""
    db = pg_db
    db.create_sessions()
    n = 3000
    if layout == "interleaved":
        expired = {i for i in range(1, n + 1) if (i * 2654435761) % 1000 < 800}
    else:
        expired = set(range(1, n // 3 + 1))
    db.insert_sessions((i, -60.0 if i in expired else LIVE, False) for i in range(1, n + 1))
    db.execute("vacuum analyze sessions")
    app = apps(db.url, {"where": None, "nice_ratio": 0})
    assert app.cleanup is not None
    strategy = app.cleanup.preview(POLICY).strategy
    if layout == "interleaved":
        assert strategy.startswith("block windows"), strategy
        assert "their range spans the table" in strategy
        assert "by the planner's estimate" in strategy  # no exact count was needed
    else:
        assert strategy.startswith("key windows"), strategy
    opened = app.cleanup.open_run(POLICY)
    drain(app, concurrency=2)
    assert keys_of(db, "sessions", "id") == {str(i) for i in range(1, n + 1)} - {
        str(i) for i in expired
    }
    jobs = window_jobs(db, opened.run_id)
    want = "blocks" if layout == "interleaved" else "key"
    assert {j["payload"].get("windows", "key") for j in jobs} == {want}
    assert_run_clean(db, opened.run_id)


def test_many_referenced_rows_split_no_window_and_every_run_counts_them(db: Db, apps: Apps) -> None:
    """One expired row in ten is referenced under RESTRICT (an order keeps its
    session): each window's delete leaves those out, with no split (splitting
    them out cost two jobs per referenced row, every run), and its ledger row
    counts them. The oracle: exactly the unreferenced expired rows go; the
    run's rows_blocked is the referenced ones; the next run deletes nothing
    more and counts them again, in as many jobs as windows."""
    db.create_sessions()
    expired, live = range(1, 1001), range(1001, 1051)
    db.insert_sessions([(i, -3600.0, False) for i in expired])
    db.insert_sessions([(i, 86_400.0, False) for i in live])
    db.execute(
        "create table orders (id integer primary key, session_id bigint not null"
        " references sessions (id) on delete restrict)"
    )
    referenced = set(range(5, 1001, 10))
    db.execute("insert into orders values " + ", ".join(f"({i}, {i})" for i in sorted(referenced)))
    app = apps(db.url, {"where": None, "window": 100})
    assert app.cleanup is not None
    app.cleanup.check()

    opened = app.cleanup.open_run(POLICY)
    drain(app)
    assert db.ids() == referenced | set(live)  # the oracle: the rest of the expired went
    ledger = db.ledger(opened.run_id)
    assert not [r for r in ledger if r["action"] == "split"]
    kept = db.rows("select coalesce(sum(rows_kept), 0) from expiry.ledger")[0][0]
    assert int(kept) == len(referenced)
    summary = app.runs.summary(opened.run_id)
    assert summary is not None
    assert (summary["rows_affected"], summary["rows_blocked"]) == (900, 100)
    windows = len(db.windows(opened.run_id))
    assert windows <= 12  # about 1,000 / 100, not 10 + 2 x 100

    cutoff = opened.cutoff + timedelta(seconds=1)
    wait_for(lambda: now_of(db) > cutoff, what="a second later")
    later = app.cleanup.open_run(POLICY, cutoff)
    drain(app)
    assert db.ids() == referenced | set(live)
    summary = app.runs.summary(later.run_id)
    assert summary is not None
    assert (summary["rows_affected"], summary["rows_blocked"]) == (0, 100)
    assert len(db.windows(later.run_id)) <= 12
    assert_run_clean(db, later.run_id)


@pytest.mark.parametrize("windows", ["auto", "time", "blocks"])
def test_a_referenced_row_is_kept_and_the_rest_deleted(
    db: Db, apps: Apps, tmp_path: Path, windows: str
) -> None:
    if windows == "blocks" and db.dialect in ("sqlite", "mysql"):
        # SQLite's and InnoDB's rows have no address a window can scan: refused, with the fix.
        db.create_sessions()
        refused = apps(db.url, {"windows": "blocks"})
        assert refused.cleanup is not None
        with pytest.raises(SchemaError, match='windows = "blocks" reads row addresses.*"time"'):
            refused.cleanup.check()
        return
    db.create_sessions()
    db.insert_sessions([(i, -3600.0, False) for i in range(1, 101)])
    db.execute(
        "create table orders (id integer primary key, session_id bigint not null"
        " references sessions (id) on delete restrict)"
    )
    db.execute(
        "create table visits (id integer primary key, session_id bigint"
        " references sessions (id) on delete cascade)"
    )
    db.execute("insert into orders values (1, 37)")
    db.execute("insert into visits values (1, 12), (2, 12), (3, 99)")
    app = apps(db.url, {"where": None, "window": 50, "windows": windows})
    assert app.cleanup is not None
    warnings = app.cleanup.check()
    # Stepped around: no where to write; only the index the check reads by.
    assert not [w for w in warnings if "orders" in w and "not exists" in w]
    notes = app.cleanup.target(POLICY).notes
    assert any("orders" in n and "kept and counted in the ledger" in n for n in notes)
    assert any("visits" in n and "deleted too" for n in notes)

    opened = app.cleanup.open_run(POLICY)
    drain(app)
    assert db.ids() == {37}  # 99 of 100 deleted; the referenced row kept
    assert int(db.scalar("select count(*) from visits")) == 0  # cascaded
    [blocked] = [r for r in db.rows("select blocked from expiry.ledger where blocked is not null")]
    assert blocked[0] == "1 row kept: referenced by rows of orders"
    summary = app.runs.summary(opened.run_id)
    assert summary is not None and summary["rows_blocked"] == 1 and summary["rows_affected"] == 99
    assert {j["state"] for j in db.jobs(run_id=opened.run_id)} == {"completed"}
    assert not [r for r in db.ledger(opened.run_id) if r["action"] == "split"]  # none split

    # The where that check proposes skips the referenced row: nothing is blocked.
    db.insert_sessions([(i, -3600.0, False) for i in range(200, 210)])
    db.execute("insert into orders values (2, 205)")
    where = "not exists (select 1 from orders r where r.session_id = sessions.id)"
    filtered = apps(db.url, {"where": where, "window": 50, "windows": windows})
    assert filtered.cleanup is not None
    # A later run (run ids count whole seconds: its cutoff must be a later second).
    cutoff = opened.cutoff + timedelta(seconds=1)
    wait_for(lambda: now_of(db) > cutoff, what="a second later")
    later = filtered.cleanup.open_run(POLICY, cutoff)
    assert later.created
    drain(filtered)
    assert db.ids() == {37, 205}
    summary = filtered.runs.summary(later.run_id)
    assert summary is not None and summary["rows_blocked"] == 0 and summary["rows_affected"] == 9
