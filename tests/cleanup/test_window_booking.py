"""A window's delete and its ledger row are one piece of bookkeeping: the delete
is guarded by the ledger and the ledger row carries its count. A duplicate
delivery changes nothing, even when it races the first; a window's statement is
built once; a run is finished once per claimed batch, not after every window."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from psycopg.pq import TransactionStatus

from expiry.app import App
from expiry.cleanup.runs import WINDOW
from expiry.cleanup.service import Cleanup
from expiry.cleanup.target import Target
from expiry.cleanup.windows import Span
from expiry.engines.mysql.sessions import parse_url
from expiry.errors import AlreadyApplied
from expiry.times import parse_time

from ._support import (
    Db,
    assert_run_clean,
    claim_plan,
    doomed,
    expected_windows,
    run_worker,
    standard_rows,
    wait_for,
)

Apps = Callable[..., App]
POLICY = "expired-sessions"
ARCHIVE = {"action": "archive", "archive_table": "sessions_archive"}


def seed(db: Db, n: int = 1000) -> set[int]:
    db.create_sessions()
    rows = standard_rows(n)
    db.insert_sessions(rows)
    return doomed(rows)


def test_a_duplicate_archive_delivery_moves_nothing(db: Db, apps: Apps) -> None:
    gone = seed(db, 600)
    db.create_sessions_archive()
    app = apps(db.url, ARCHIVE)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)
    assert_run_clean(db, opened.run_id)
    ledger = db.ledger()
    assert sum(row["rows"] for row in ledger) == len(gone) == db.count("sessions_archive")

    # A row of the first window expires anew: a second application would move it.
    window = db.windows(opened.run_id)[0]
    lo = window["payload"]["lo"]
    db.insert_sessions([(lo + 1, -60.0, False)])
    before = (db.table(), db.table("sessions_archive"))
    db.redeliver(window["key"])
    run_worker(app)

    assert (db.table(), db.table("sessions_archive")) == before
    assert db.ledger() == ledger
    assert db.audit("window.duplicate", window["key"]) == 1


@pytest.mark.parametrize("mode", ["transaction", "pipelined", "statement"])
def test_a_delivery_racing_an_uncommitted_one_rolls_back_its_delete(
    pg_db: Db, apps: Apps, mode: str
) -> None:
    """The ledger guard reads the statement's snapshot: a delivery that starts while
    another has booked the window but not committed passes it and deletes, then its
    ledger insert waits for that commit, finds the key taken, and rolls back: in a
    transaction (plain or pipelined), or as the one statement of the worker's
    statement mode. Either way the connection goes back to the pool as it came."""
    db = pg_db
    seed(db, 300)
    app = apps(db.url, {"lock_timeout": "30s"}, pool_size=1)  # one connection, checked after
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    claim_plan(app)
    [job] = app.queue.claim(1, 60, owner="late", queues=app.worked_queues())
    assert job.handler == WINDOW
    table = db.table()

    other = psycopg.connect(db.url)
    other.execute(
        "insert into expiry.ledger (key, run_id, rows_affected) values (%s, %s, 0)",
        (job.key, opened.run_id),
    )
    outcome: list[BaseException] = []

    def deliver() -> None:
        try:
            with app.engine.transaction(
                pipelined=mode == "pipelined", statement=mode == "statement"
            ) as tx:
                app.handlers[WINDOW].fn(job, tx)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=deliver)
    thread.start()
    try:
        wait_for(
            lambda: db.scalar(
                "select count(*) from pg_stat_activity where datname = current_database()"
                " and wait_event_type = 'Lock' and query like '%window_apply%'"
            ),
            what="the racing delivery to wait for the other's ledger row",
        )
        other.commit()
    finally:
        other.close()
        thread.join(30)
    assert not thread.is_alive()

    [raised] = outcome
    assert isinstance(raised, AlreadyApplied)
    assert db.table() == table  # its delete was rolled back
    assert [(row["key"], row["rows"]) for row in db.ledger()] == [(job.key, 0)]
    running = app.queue.get(job.key)
    assert running is not None and running.state.value == "running"  # completion undone too
    with app.engine.pool.connection() as conn:  # back in the pool as it came out
        assert conn.info.transaction_status == TransactionStatus.IDLE
        assert not conn.autocommit and not conn.pgconn.pipeline_status


def test_on_mysql_a_delivery_racing_an_uncommitted_one_waits_at_the_guard(
    mysql_url: str, apps: Apps
) -> None:
    """MariaDB: a delivery that starts while another delivery's ledger row is
    uncommitted waits at its delete's ledger guard (InnoDB reads a DELETE's
    subquery with locks), sees the row once committed, takes nothing and is
    audited as a duplicate: the race that the strict ledger insert guards on
    PostgreSQL (test_a_delivery_racing_an_uncommitted_one_rolls_back_its_delete)
    cannot reach a delete here, one row or many."""
    db = Db(mysql_url)
    db.create_sessions()
    db.insert_sessions([(1, -60.0, False), *((i, 86_400.0, False) for i in range(2, 10))])
    app = apps(mysql_url, {"lock_timeout": "30s", "where": None})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    claim_plan(app)
    [job] = app.queue.claim(1, 60, owner="late", queues=app.worked_queues())
    assert job.handler == WINDOW
    table = db.table()

    other = pymysql.connect(**parse_url(mysql_url), autocommit=False)
    with other.cursor() as cur:
        cur.execute(
            "insert into expiry_ledger (`key`, run_id, rows_affected, applied_at)"
            " values (%s, %s, 0, utc_timestamp(6))",
            (job.key, opened.run_id),
        )
    outcome: list[Any] = []

    def deliver() -> None:
        try:
            with app.engine.transaction() as tx:
                outcome.append(app.handlers[WINDOW].fn(job, tx))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=deliver)
    thread.start()
    try:

        def lock_waits() -> list[tuple[Any, ...]]:
            # InnoDB refreshes this table's cache only after 0.1 s without a read.
            time.sleep(0.2)
            return db.rows(
                "select trx_rows_modified, trx_query from information_schema.innodb_trx"
                " where trx_state = 'LOCK WAIT'"
            )

        waiting = wait_for(lock_waits, what="the racing delivery to wait for the ledger row")
        other.commit()
    finally:
        other.close()
        thread.join(30)
    assert not thread.is_alive()

    [(modified, query)] = waiting
    assert query.lstrip().startswith("/* expiry window") and "delete from" in query
    assert int(modified) == 0  # it waits at the guard, before any row is deleted
    [result] = outcome
    assert not isinstance(result, BaseException), result
    assert db.table() == table
    assert [(row["key"], row["rows"]) for row in db.ledger()] == [(job.key, 0)]
    assert db.audit("window.duplicate", job.key) == 1


def test_concurrent_deliveries_of_a_window_take_turns_and_the_later_takes_nothing(
    pg_db: Db, apps: Apps
) -> None:
    db = pg_db
    seed(db, 300)
    app = apps(db.url, {"lock_timeout": "30s"})
    assert app.cleanup is not None
    app.cleanup.open_run(POLICY)
    claim_plan(app)
    [job] = app.queue.claim(1, 60, owner="first", queues=app.worked_queues())
    p = job.payload
    target = app.cleanup.target(POLICY)
    applied, release = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def deliver(name: str) -> None:
        # The window's statements without the job's completion: one job cannot be
        # completed twice, and this race is between two applications of a window.
        with app.engine.transaction() as tx:
            results[name] = target.apply(
                tx,
                parse_time(p["cutoff"]),
                Span.of(p),
                key=job.key,
                run_id=p["run_id"],
                worker=name,
            )
            if name == "first":
                applied.set()
                release.wait(30)

    first = threading.Thread(target=deliver, args=("first",))
    first.start()
    assert applied.wait(30)
    later = threading.Thread(target=deliver, args=("later",))
    later.start()
    try:
        wait_for(
            lambda: db.scalar(
                "select count(*) from pg_stat_activity where datname = current_database()"
                " and wait_event = 'advisory'"
            ),
            what="the later delivery to wait for the window's turn",
        )
    finally:
        release.set()
        first.join(30)
        later.join(30)

    assert results["first"] > 0
    assert results["later"] is None  # booked before: nothing taken
    assert [row["key"] for row in db.ledger()] == [job.key]


def test_each_statement_of_a_window_is_built_once(
    db: Db, apps: Apps, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(db)
    built: list[tuple[str, str]] = []
    statement = Target.statement

    def spy(self: Target, template: str, *, span: str = "key", **kwargs: Any) -> Any:
        built.append((template, span))
        return statement(self, template, span=span, **kwargs)

    monkeypatch.setattr(Target, "statement", spy)
    app = apps(db.url)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)

    assert_run_clean(db, opened.run_id)
    assert len(db.windows(opened.run_id)) > 2
    assert max(built.count(text) for text in built) == 1  # per template and span


def test_the_run_is_finished_once_per_claimed_batch(
    db: Db, apps: Apps, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = standard_rows(1000)
    db.create_sessions()
    db.insert_sessions(rows)
    app = apps(db.url, {"nice_ratio": 0, "target_transaction": "1h"})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)

    checks: list[set[str]] = []
    finish_runs = Cleanup.finish_runs

    def spy(self: Cleanup, run_ids: set[str]) -> None:
        checks.append(set(run_ids))
        finish_runs(self, run_ids)

    monkeypatch.setattr(Cleanup, "finish_runs", spy)
    # One loop claiming the whole batch (larger than the run) at once, and no
    # rescuer sweep to help.
    worker = app.worker(batch=16, claim_hold=None, until_idle=True, poll=0.05, rescue_every=3600)
    assert worker.run() == 0

    windows = len(expected_windows(doomed(rows), 100))
    assert windows > 2
    assert db.run_state(opened.run_id) == "finished"
    assert_run_clean(db, opened.run_id)
    # The planning job's batch, then the windows' batch: not one check per window.
    assert checks == [{opened.run_id}, {opened.run_id}]


def round_trips(trace: str) -> int:
    """Round trips in a libpq protocol trace: each run of the client's messages
    (F) that the server's (B) answer."""
    directions = [line.split("\t")[1] for line in trace.splitlines() if "\t" in line]
    return sum(1 for pair in pairwise(directions) if pair == ("F", "B"))


def test_a_window_costs_one_round_trip_on_postgres(pg_db: Db, apps: Apps, tmp_path: Path) -> None:
    """The worker's statement mode: window_apply (turn, delete, completion, ledger
    row) alone, its own transaction, with no BEGIN or COMMIT; then the batch's run
    check. The first window on a connection also prepares its statements and sets
    the policy's limits on the session; the second is counted, in libpq's
    protocol trace of the pool's one connection."""
    db = pg_db
    seed(db, 300)
    app = apps(db.url, {"nice_ratio": 0}, pool_size=1)  # the second window follows at once
    assert app.cleanup is not None
    app.cleanup.open_run(POLICY)
    claim_plan(app)
    first, second = app.queue.claim(2, 60, owner="traced", queues=app.worked_queues())
    assert first.handler == second.handler == WINDOW
    app.worker().process(first)
    with app.engine.pool.connection() as conn:  # back in the pool now: no check
        pgconn = conn.pgconn
    trace = tmp_path / "libpq.trace"
    with trace.open("w") as out:
        pgconn.trace(out.fileno())
        try:
            app.worker().process(second)
        finally:
            pgconn.untrace()
    text = trace.read_text()

    booked = {row["key"]: row for row in db.ledger()}[second.key]
    assert booked["rows"] > 0
    completed = app.queue.get(second.key)
    assert completed is not None and completed.state.value == "completed"
    assert round_trips(text) == 2, text
    window = text[: text.index("ReadyForQuery")]
    assert 'delete from "sessions"' in window, text  # the window's statement, bound
    assert f"DataRow\t 1 {len(str(booked['rows']))} '{booked['rows']}'" in window, text
    for absent in ('"begin"', '"commit"', "set_config", "pg_advisory_xact_lock", "Parse"):
        assert absent not in window, text  # prepared, limits already set, no BEGIN/COMMIT


def test_a_window_runs_under_its_policys_limits_and_other_work_under_its_own(
    pg_db: Db, apps: Apps
) -> None:
    """In statement mode the policy's limits are the session's (PostgreSQL arms a
    statement's timeout as it starts), set once; a transaction of another kind on
    the same connection gets the connection's own limits back."""
    db = pg_db
    seed(db, 300)
    db.execute(
        "create function slow_delete() returns trigger language plpgsql as $$"
        " begin perform pg_sleep(0.5); return null; end $$"
    )
    db.execute(
        "create trigger slow_delete before delete on sessions"
        " for each statement execute function slow_delete()"
    )
    app = apps(db.url, {"statement_timeout": "100ms", "lock_timeout": "250ms"}, pool_size=1)
    assert app.cleanup is not None
    app.cleanup.open_run(POLICY)
    claim_plan(app)
    [job] = app.queue.claim(1, 60, owner="timed", queues=app.worked_queues())
    table = db.table()

    app.worker().process(job)

    failed = app.queue.get(job.key)
    assert failed is not None and failed.state.value == "retryable"
    assert failed.last_error_kind == "statement_timeout", failed.last_error
    assert db.table() == table and db.ledger() == []
    with app.engine.pool.connection() as conn:  # the pool's one connection
        assert conn.execute("show statement_timeout").fetchone() == {"statement_timeout": "100ms"}
        conn.rollback()
    with app.engine.transaction() as tx:
        limits = tx.execute(
            "select current_setting('statement_timeout') as s, current_setting('lock_timeout') as l"
        ).fetchone()
    assert limits == {"s": "0", "l": "0"}


def test_a_key_window_takes_and_books_exactly_the_rows_of_its_range(db: Db, apps: Apps) -> None:
    """Windows (lo, hi] applied last first, each lo an expired key: a window
    that reached its lower bound would take the key of the window below it
    (the table ends the same; the ledger's counts would not)."""
    gone = seed(db, 300)
    app = apps(db.url)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    target = app.cleanup.target(POLICY)
    spans = [(199, 299), (99, 199), (-1, 99)]
    assert {99, 199} <= gone, "each lower bound is a key the window below must take"
    for lo, hi in spans:
        with app.engine.transaction() as tx:
            taken = target.apply(
                tx,
                opened.cutoff,
                Span.keys(lo, hi),
                key=f"{opened.run_id}:test:{lo}",
                run_id=opened.run_id,
                worker="test",
            )
        assert taken == len({i for i in gone if lo < i <= hi}), (lo, hi, taken)
    booked = {row["key"]: row["rows"] for row in db.ledger(opened.run_id)}
    assert booked == {
        f"{opened.run_id}:test:{lo}": len({i for i in gone if lo < i <= hi}) for lo, hi in spans
    }
    assert db.ids() == set(range(1, 301)) - gone


def test_a_run_counts_a_window_delivered_again_after_its_lease_was_lost(db: Db, apps: Apps) -> None:
    """A worker claims a window and is lost (its lease runs out): the rescuer
    gives the window to another delivery, which applies it. The run counts one
    redelivery and no retry, every window done; a redrive or a refunded attempt
    never makes the count negative (it used to be attempts - jobs - failures,
    "Redelivered -17" on the dashboard after a redrive)."""
    seed(db, 300)
    app = apps(db.url)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    claim_plan(app)
    [lost] = app.queue.claim(1, 0.2, owner="lost", queues=app.worked_queues())
    assert lost.handler == WINDOW
    wait_for(lambda: app.queue.rescue() == 1, timeout=10, what="the lost lease to be rescued")
    run_worker(app)

    summary = app.runs.summary(opened.run_id)
    assert summary is not None and summary["state"] == "finished"
    assert summary["jobs_done"] == summary["jobs_total"] > 1
    assert (summary["redelivered"], summary["retries"]) == (1, 0)
    assert_run_clean(db, opened.run_id)
