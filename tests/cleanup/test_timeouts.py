"""A window whose delete times out is retried smaller, never at the same size
until it dies. After a statement timeout each attempt takes the first half of
what the last one tried (the rest queued as a continuation with attempts of its
own), down to one row; that row, still timing out alone, is kept and booked as
blocked with the database's words, and the run finishes. After a lock wait ran
out, the next attempt asks which candidates another transaction holds (``for
update skip locked``) and cuts the window around them at once: the free rows
are taken, each held row kept as blocked, with one lock wait per window, not
one per halving. A window at its last attempt is split instead of dead-lettered.

On PostgreSQL and MariaDB, with real timeouts: a row held by another
connection's SELECT ... FOR UPDATE past lock_timeout, and a row whose delete
(a trigger that sleeps, as a cascade to a big unindexed child would) outlasts
statement_timeout. SQLite has neither: its "database is locked" is the one
writer's lock on the whole database, met at BEGIN IMMEDIATE before a window's
first statement, which no smaller window would avoid (engine.window_shrinks).

The oracle is plain SQL: every expired row but the held one is gone.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from expiry.app import App
from expiry.cleanup.pacing import MIN_CHUNK

from ._support import Db, MySQLConn, grant_expiry_tables, wait_for

Apps = Callable[..., App]
POLICY = "expired-sessions"
ROWS = 64
HELD = 37
"""The row that cannot be deleted: held by a lock, or slow to delete."""
WORDS = {
    ("postgres", "lock_timeout"): "canceling statement due to lock timeout",
    ("mysql", "lock_timeout"): "Lock wait timeout exceeded",
    ("postgres", "statement_timeout"): "canceling statement due to statement timeout",
    ("mysql", "statement_timeout"): "Query execution was interrupted (max_statement_time exceeded)",
}


@pytest.fixture(params=["postgres", "mysql"])
def server_db(request: pytest.FixtureRequest) -> Iterator[Db]:
    """A test database on each engine that has statement and lock timeouts."""
    url = request.getfixturevalue("pg_url" if request.param == "postgres" else "mysql_url")
    db = Db(url)
    yield db
    db.close()


def seed(db: Db, ids: range = range(1, ROWS + 1)) -> set[int]:
    """``ids``, all expired an hour ago: the ids a run must delete."""
    db.create_sessions()
    db.insert_sessions([(i, -3600.0, False) for i in ids])
    return set(ids)


@contextmanager
def row_held(db: Db, row: int) -> Iterator[int]:
    """Another connection (application_name billing-report on PostgreSQL)
    holds ``row``'s lock (SELECT ... FOR UPDATE, its transaction open) for the
    block, which gets that session's id."""
    if db.dialect == "postgres":
        with psycopg.connect(db.url, application_name="billing-report") as conn:
            pid = conn.execute("select pg_backend_pid()").fetchone()
            assert pid is not None
            conn.execute("select id from sessions where id = %s for update", (row,))
            yield int(pid[0])
            conn.rollback()
        return
    other = MySQLConn(db.url)
    try:
        holder = int(other.execute("select connection_id()").fetchall()[0][0])
        other.execute("begin")
        other.execute("select id from sessions where id = %s for update", (row,)).fetchall()
        yield holder
        other.execute("rollback")
    finally:
        other.close()


def make_row_slow(db: Db, row: int) -> None:
    """Deleting ``row`` takes a second, as a row with a big unindexed child
    under ON DELETE CASCADE would: every other row deletes at once."""
    if db.dialect == "postgres":
        db.execute(
            "create function slow_delete() returns trigger language plpgsql as $$"
            f" begin if old.id = {row} then perform pg_sleep(1); end if; return old; end $$"
        )
        db.execute(
            "create trigger slow_delete before delete on sessions"
            " for each row execute function slow_delete()"
        )
    else:
        db.execute(
            "create trigger slow_delete before delete on sessions for each row"
            f" begin if old.id = {row} then do sleep(1); end if; end"
        )


def make_rows_slow(db: Db, rows: tuple[int, ...]) -> None:
    """Deleting each of ``rows`` takes a second (PostgreSQL)."""
    listed = ", ".join(str(r) for r in rows)
    db.execute(
        "create function slow_delete() returns trigger language plpgsql as $$"
        f" begin if old.id in ({listed}) then perform pg_sleep(1); end if; return old; end $$"
    )
    db.execute(
        "create trigger slow_delete before delete on sessions"
        " for each row execute function slow_delete()"
    )


def drive(app: App, db: Db, run_id: str, rounds: int = 80) -> None:
    """Run a worker until it is idle, make the retries due at once (their
    backoff skipped), and again, until the run finished or nothing waits."""
    for _ in range(rounds):
        app.worker(until_idle=True, concurrency=1, poll=0.05, rescue_every=0.2).run()
        if db.run_state(run_id) == "finished":
            return
        waiting = db.execute(
            "update expiry.jobs set run_at = {now} where state in ('retryable', 'scheduled')"
        )
        if not waiting:
            return


def work_until_finished(app: App, db: Db, run_id: str, timeout: float) -> float:
    """Seconds a worker, as shipped (no retry made due by hand), takes to
    finish the run; fails past ``timeout``."""
    worker = app.worker(concurrency=1, poll=0.05, rescue_every=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    began = time.monotonic()
    thread.start()
    try:
        wait_for(lambda: db.run_state(run_id) == "finished", timeout, "the run")
    finally:
        worker.stop()
        thread.join(10)
    return time.monotonic() - began


def timeouts(db: Db) -> list[str]:
    """The kind of every failed attempt of the windows, in job order."""
    kinds: list[str] = []
    for (errors,) in db.rows("select errors from expiry.jobs order by id"):
        listed: list[dict[str, Any]] = errors if isinstance(errors, list) else json.loads(errors)
        kinds += [e["kind"] for e in listed]
    return kinds


def assert_only_the_held_row_remains(
    db: Db,
    app: App,
    run_id: str,
    doomed: set[int],
    kind: str,
    max_attempts: int,
    kept: set[int] = frozenset({HELD}),
) -> None:
    """The oracle, plain SQL on the table: of the rows seeded expired, only
    ``kept`` are left, each in a one-key window booked as blocked with the
    database's words; every job completed within its attempts; the run finished."""
    assert db.ids() == doomed & kept
    jobs = db.jobs(run_id=run_id)
    assert {j["state"] for j in jobs} == {"completed"}, [(j["key"], j["state"]) for j in jobs]
    assert max(j["attempt"] for j in jobs) <= max_attempts
    assert db.run_state(run_id) == "finished"
    blocked = db.rows(
        "select bounds, blocked from expiry.ledger where blocked is not null order by bounds"
    )
    assert [bounds for bounds, _ in blocked] == [f"keys ({k - 1}, {k}]" for k in sorted(kept)]
    for (_, text), k in zip(blocked, sorted(kept), strict=True):
        assert text.startswith(f"id {k}: {WORDS[db.dialect, kind]}"), text
        assert f"({kind} " in text, text
    summary = app.runs.summary(run_id)
    assert summary is not None
    taken = len(doomed) - len(kept)
    assert (summary["rows_affected"], summary["rows_blocked"]) == (taken, len(kept))
    assert set(timeouts(db)) <= {kind}


def test_a_window_behind_a_held_row_is_cut_around_it_after_one_lock_wait(
    server_db: Db, apps: Apps
) -> None:
    """After one lock wait the window is cut around the held row: the rest of
    the window is deleted, the held row booked as blocked with the database's
    words, and the run finishes, no job dead-lettered. A redelivered window
    then changes nothing."""
    db = server_db
    # InnoDB counts lock waits in whole seconds: fewer rows there, fewer waits.
    mariadb = db.dialect == "mysql"
    doomed = seed(db, range(HELD - 12, HELD + 4) if mariadb else range(1, ROWS + 1))
    lock_timeout = "1s" if mariadb else "100ms"
    app = apps(db.url, {"where": None, "window": ROWS, "lock_timeout": lock_timeout})
    assert app.cleanup is not None
    # InnoDB's range scan (MariaDB) also locks the first row past a window's
    # range: the one-key window of the row just below the held one waits on
    # it too, and that row is kept as well.
    kept = {HELD - 1, HELD} if mariadb else {HELD}
    with row_held(db, HELD):
        opened = app.cleanup.open_run(POLICY)
        drive(app, db, opened.run_id)
        assert_only_the_held_row_remains(db, app, opened.run_id, doomed, "lock_timeout", 8, kept)
        # One lock wait, then the probe: halving took about 2 log2(n) of them.
        print(f"{len(timeouts(db))} timeouts to isolate the held row among {len(doomed)}")
        assert len(timeouts(db)) == 1, timeouts(db)
    said = dict(db.rows("select bounds, blocked from expiry.ledger where blocked is not null"))
    assert said[f"keys ({HELD - 1}, {HELD}]"].endswith("; held by another transaction)")
    if mariadb:  # kept for its neighbour's lock, and said so
        below = said[f"keys ({HELD - 2}, {HELD - 1}]"]
        assert below.endswith("; next to a row another transaction holds)"), below

    ledger = db.rows("select key, rows_affected, blocked from expiry.ledger order by key")
    for (key,) in db.rows("select key from expiry.jobs where handler = 'expiry.window'"):
        db.redeliver(key)
    drive(app, db, opened.run_id)
    assert db.ids() == kept  # the lock is gone, but this run booked the row: a later run's
    assert db.rows("select key, rows_affected, blocked from expiry.ledger order by key") == ledger


def test_a_lock_wait_says_whom_it_waited_behind(server_db: Db, apps: Apps) -> None:
    """A window's lock wait that ran out names the sessions holding locks on
    the table (PostgreSQL) or row locks (MariaDB): pid, application, state,
    how long its transaction is open and its statement, in the window's error,
    which the dashboard's job page and the dead-letter queue show."""
    db = server_db
    mariadb = db.dialect == "mysql"
    seed(db, range(HELD - 4, HELD + 4))
    app = apps(
        db.url, {"where": None, "window": ROWS, "lock_timeout": "1s" if mariadb else "100ms"}
    )
    assert app.cleanup is not None
    with row_held(db, HELD) as holder:
        time.sleep(0.2)  # its transaction has been open a while
        opened = app.cleanup.open_run(POLICY)
        drive(app, db, opened.run_id)
    errors = [
        e["error"]
        for (listed,) in db.rows("select errors from expiry.jobs order by id")
        for e in (listed if isinstance(listed, list) else json.loads(listed))
        if e["kind"] == "lock_timeout"
    ]
    assert errors, "no lock wait ran out"
    said = errors[0]
    assert f"{WORDS[db.dialect, 'lock_timeout']}" in said, said
    assert f"(behind pid {holder} (" in said, said
    if not mariadb:  # MariaDB shows an idle transaction's user and no statement
        assert f"pid {holder} (billing-report, idle in transaction, transaction open " in said
        assert "select id from sessions where id = " in said, said
    opened_for = float(said.split("transaction open ", 1)[1].split(" s)", 1)[0])
    assert 0.1 <= opened_for < 60, said
    assert db.ids() == {HELD} | ({HELD - 1} if mariadb else set())


def test_a_row_slower_than_statement_timeout_is_kept_and_the_rest_deleted(
    server_db: Db, apps: Apps
) -> None:
    db = server_db
    doomed = seed(db)
    make_row_slow(db, HELD)
    app = apps(db.url, {"where": None, "window": ROWS, "statement_timeout": "200ms"})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    drive(app, db, opened.run_id)
    assert_only_the_held_row_remains(db, app, opened.run_id, doomed, "statement_timeout", 8)


@pytest.mark.parametrize("max_attempts", [1, 2])
def test_a_window_that_times_out_at_its_last_attempt_is_split_not_dead(
    server_db: Db, apps: Apps, max_attempts: int
) -> None:
    """max_attempts bounds each job, not the window: a timeout at a job's last
    attempt (max_attempts = 1) splits what it tried into two jobs with
    attempts of their own; with more, the smaller retries spend no attempt,
    so the last is never reached."""
    db = server_db
    doomed = seed(db)
    make_row_slow(db, HELD)
    app = apps(
        db.url,
        {
            "where": None,
            "window": ROWS,
            "statement_timeout": "400ms",
            "max_attempts": max_attempts,
        },
    )
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    drive(app, db, opened.run_id)
    assert_only_the_held_row_remains(
        db, app, opened.run_id, doomed, "statement_timeout", max_attempts
    )
    splits = db.scalar("select count(*) from expiry.ledger where action = 'split'")
    assert splits >= 1 if max_attempts == 1 else splits == 0


def test_time_windows_shrink_by_rows_around_a_held_row(pg_db: Db, apps: Apps) -> None:
    db = pg_db
    doomed = seed(db)
    app = apps(db.url, {"where": None, "window": ROWS, "windows": "time", "lock_timeout": "100ms"})
    assert app.cleanup is not None
    with row_held(db, HELD):
        opened = app.cleanup.open_run(POLICY)
        drive(app, db, opened.run_id)
    assert db.ids() == doomed & {HELD}
    assert db.run_state(opened.run_id) == "finished"
    [(blocked,)] = db.rows("select blocked from expiry.ledger where blocked is not null")
    assert blocked.startswith("row at (") and WORDS["postgres", "lock_timeout"] in blocked


def test_a_statement_timeout_halves_the_policys_keys_per_transaction(pg_db: Db, apps: Apps) -> None:
    """The following windows start smaller: a statement timeout halves the
    policy's keys per transaction (never under MIN_CHUNK), as a slow window
    does. A lock wait does not: a held row says nothing about the size."""
    db = pg_db
    db.create_sessions()
    db.insert_sessions([(i, -3600.0, False) for i in range(1, 801)])
    make_row_slow(db, 5)
    app = apps(db.url, {"where": None, "window": 800, "statement_timeout": "200ms"})
    assert app.cleanup is not None
    pace = app.cleanup._pace(app.cleanup.policy(POLICY))
    opened = app.cleanup.open_run(POLICY)
    app.worker(until_idle=True, concurrency=1, poll=0.05).run()  # one timeout, then a retry
    assert [j["kind"] for j in db.windows(opened.run_id)] == ["statement_timeout"]
    assert pace.chunk == 400
    db.execute("update expiry.jobs set run_at = {now} where state = 'retryable'")
    app.worker(until_idle=True, concurrency=1, poll=0.05).run()
    assert pace.chunk == 200
    assert pace.chunk >= MIN_CHUNK


def test_a_lock_wait_leaves_the_policys_keys_per_transaction_alone(pg_db: Db, apps: Apps) -> None:
    db = pg_db
    db.create_sessions()
    db.insert_sessions([(i, -3600.0, False) for i in range(1, 801)])
    app = apps(db.url, {"where": None, "window": 800, "lock_timeout": "100ms"})
    assert app.cleanup is not None
    pace = app.cleanup._pace(app.cleanup.policy(POLICY))
    with row_held(db, 5):
        opened = app.cleanup.open_run(POLICY)
        app.worker(until_idle=True, concurrency=1, poll=0.05).run()  # one lock wait
        assert [j["kind"] for j in db.windows(opened.run_id)] == ["lock_timeout"]
        assert pace.chunk == 800


def test_a_held_row_is_isolated_in_seconds_with_the_backoff_as_shipped(
    pg_db: Db, apps: Apps
) -> None:
    """No retry is made due by hand here: the attempt after the lock wait comes
    within SHRINK_RETRY_SECONDS, not after the attempt's growing backoff (the
    policy's next run waiting behind), so the run finishes in a few seconds
    around a held row; and spends no attempt (the 30-minute soak lost a worker
    on the eighth attempt of a window halved seven times: dead-lettered)."""
    doomed = seed(pg_db)
    app = apps(pg_db.url, {"where": None, "window": ROWS, "lock_timeout": "100ms"})
    assert app.cleanup is not None
    with row_held(pg_db, HELD):
        opened = app.cleanup.open_run(POLICY)
        took = work_until_finished(app, pg_db, opened.run_id, 15)
    print(f"run finished around a held row in {took:.1f}s, {len(timeouts(pg_db))} timeouts")
    assert pg_db.ids() == doomed & {HELD}
    # The retry spent no attempt: the window ends on its first, and a worker
    # lost now cannot leave it dead.
    assert len(timeouts(pg_db)) == 1
    assert {j["attempt"] for j in pg_db.jobs(run_id=opened.run_id)} == {1}


def test_a_slow_row_is_isolated_in_seconds_after_spent_attempts(pg_db: Db, apps: Apps) -> None:
    """A row slower than statement_timeout is isolated by halving, about
    log2(64) = 6 timeouts, each retry due within SHRINK_RETRY_SECONDS with no
    hand-made retry. The window has already spent four attempts (an earlier
    deadlock streak, say): after its growing backoff each halving would wait
    up to 2^5 s, and the run minutes; so it finishes in seconds. The slow row
    is the first, so each halving is this job's (the rests are new jobs)."""
    doomed = seed(pg_db)
    make_row_slow(pg_db, 1)
    app = apps(
        pg_db.url,
        {"where": None, "window": ROWS, "statement_timeout": "200ms", "max_attempts": 10},
    )
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    app.worker(until_idle=True, concurrency=1, poll=0.05).run()  # planned; one timeout
    spent = pg_db.execute(
        "update expiry.jobs set attempt = 4 where handler = 'expiry.window' and state = 'retryable'"
    )
    assert spent == 1
    took = work_until_finished(app, pg_db, opened.run_id, 20)
    print(f"run finished around a slow row in {took:.1f}s, {len(timeouts(pg_db))} timeouts")
    assert pg_db.ids() == doomed & {1}
    assert len(timeouts(pg_db)) >= 4  # halvings, each retried within a second


def test_the_rest_of_a_shrunk_window_starts_small_and_grows_back(pg_db: Db, apps: Apps) -> None:
    """Slow rows far apart in one big window are isolated in O(log n)
    statement timeouts each: the rest of a part taken after k halvings starts
    at k-1 (and doubles back one success at a time), not at full size, which
    timed out from the top again at every slow row still ahead (O(log² n) each)."""
    db = pg_db
    n, slow = 1024, (100, 400, 700, 1000)
    db.create_sessions()
    db.insert_sessions([(i, -3600.0, False) for i in range(1, n + 1)])
    make_rows_slow(db, slow)
    app = apps(db.url, {"where": None, "window": n, "statement_timeout": "400ms"})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    drive(app, db, opened.run_id, rounds=400)
    spent = len(timeouts(db))
    print(f"{spent} timeouts to isolate {len(slow)} slow rows among {n}")
    assert db.ids() == set(slow)
    assert db.run_state(opened.run_id) == "finished"
    # From full size, every continuation climbs down log2(1024) = 10 halvings
    # again for each slow row ahead of it: 4 rows cost over 100 timeouts so.
    assert spent <= len(slow) * (2 * math.log2(n) + 2), spent


def test_rows_held_apart_in_one_window_cost_one_lock_wait(server_db: Db, apps: Apps) -> None:
    """Four rows held far apart in one window of 1,024: one lock wait, then the
    window is cut around each held row as the probe finds it (halving waited
    out about 2 log2(n) lock timeouts for each). The oracle: exactly the held
    rows are left (on MariaDB also the row below each, whose range read meets
    the held row's lock), each booked as blocked; the run finishes."""
    db = server_db
    mariadb = db.dialect == "mysql"
    n, held = 1024, (100, 400, 700, 1000)
    db.create_sessions()
    db.insert_sessions([(i, -3600.0, False) for i in range(1, n + 1)])
    app = apps(db.url, {"where": None, "window": n, "lock_timeout": "1s" if mariadb else "50ms"})
    assert app.cleanup is not None
    with ExitStack() as held_rows:
        for row in held:
            held_rows.enter_context(row_held(db, row))
        opened = app.cleanup.open_run(POLICY)
        drive(app, db, opened.run_id, rounds=400)
        left = db.ids()
    spent = len(timeouts(db))
    print(f"{spent} lock waits to cut around {len(held)} held rows among {n}; left {sorted(left)}")
    assert set(held) <= left <= set(held) | {h - 1 for h in held} if mariadb else left == set(held)
    assert db.run_state(opened.run_id) == "finished"
    blocked = db.scalar("select count(*) from expiry.ledger where blocked is not null")
    assert blocked == len(left)
    assert spent <= (len(left) if mariadb else 1), timeouts(db)


@contextmanager
def role_without_update(db: Db) -> Iterator[str]:
    """A login role with expiry's tables (migrated) and SELECT, DELETE on
    sessions, as the README grants a worker, but not UPDATE: it may not lock
    the table's rows (SELECT ... FOR UPDATE); yields its URL."""
    role = f"expiry_nolock_{os.getpid()}"
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute(f"drop role if exists {role}")
        conn.execute(f"create role {role} login")
        grant_expiry_tables(conn, role)
        conn.execute(f"grant select, delete on sessions to {role}")
    try:
        params = conninfo_to_dict(db.url)
        host, port = params.get("host", "127.0.0.1"), params.get("port", 5432)
        yield f"postgresql://{role}@{host}:{port}/{params['dbname']}"
    finally:
        with psycopg.connect(db.url, autocommit=True) as conn:
            conn.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity where usename = %s",
                (role,),
            )
            conn.execute(f"drop owned by {role}")
            conn.execute(f"drop role if exists {role}")


def test_a_role_that_may_not_lock_rows_halves_around_a_held_row(
    pg_db: Db, apps: Apps, caplog: pytest.LogCaptureFixture
) -> None:
    """SELECT ... FOR UPDATE needs the UPDATE privilege on PostgreSQL: where the
    role lacks it, the probe is refused, and the window is halved around the
    held row as before (a lock wait a halving) instead of dead-lettered; the
    refusal is said once, with the grant that fixes it."""
    db = pg_db
    doomed = seed(db)
    apps(db.url).migrate()
    caplog.set_level("WARNING", logger="expiry.cleanup")
    with role_without_update(db) as url, row_held(db, HELD):
        app = apps(url, {"where": None, "window": ROWS, "lock_timeout": "50ms"})
        assert app.cleanup is not None
        opened = app.cleanup.open_run(POLICY)
        drive(app, db, opened.run_id)
        assert_only_the_held_row_remains(db, app, opened.run_id, doomed, "lock_timeout", 8)
        app.close()
    assert len(timeouts(db)) > 2  # halvings, one lock wait each
    said = [r.getMessage() for r in caplog.records if "may not lock" in r.getMessage()]
    assert len(said) == 1 and "grant update on the table" in said[0], said
