"""The safety properties a planted bug would break, asserted on the data: a
`where` with `or` is one predicate, a non-zero retain keeps the rows it names, a
run is not finished while one of its windows is pending, and a redelivered
window takes nothing. tools/mutants.py plants those bugs and runs these tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import psycopg

from expiry.app import App
from expiry.cleanup.runs import WINDOW
from expiry.cleanup.service import Cleanup
from expiry.types import JobState

from ._support import (
    LIVE,
    Db,
    assert_run_clean,
    claim_plan,
    doomed,
    run_worker,
    standard_rows,
)

Apps = Callable[..., App]
POLICY = "expired-sessions"


def seed(db: Db, n: int = 300) -> tuple[set[int], set[int]]:
    """The standard table; returns (all ids, ids a cleanup must delete)."""
    db.create_sessions()
    rows = standard_rows(n)
    db.insert_sessions(rows)
    return {i for i, _, _ in rows}, doomed(rows)


# -- the where predicate ---------------------------------------------------------------


def test_a_where_with_or_is_applied_as_one_predicate(db: Db, apps: Apps) -> None:
    """`where = "a or b"` means `expired and (a or b)`: live rows that match `b`
    stay. Six kinds of row by id % 6: (expires in seconds, revoked, user_id)."""
    kinds = {
        0: (LIVE, False, 0),  # live: kept, though user 0
        1: (LIVE, True, 0),  # live and revoked: kept, though user 0
        2: (-7200.0, True, 7),  # expired, revoked, user 7: matches neither branch
        3: (-7200.0, True, 0),  # expired, revoked, user 0: the `or` branch
        4: (-7200.0, False, 7),  # expired, not revoked: the first branch
        5: (-7200.0, False, 0),  # expired, both branches
    }
    db.create_sessions()
    ids = range(1, 301)
    db.insert_sessions((i, kinds[i % 6][0], kinds[i % 6][1]) for i in ids)
    db.execute("update sessions set user_id = 7 where id % 6 in (2, 4)")
    gone = {i for i in ids if i % 6 in (3, 4, 5)}
    kept = [row for row in db.table() if row[0] not in gone]

    app = apps(db.url, {"where": "revoked_at is null or user_id = 0", "window": 50})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)

    assert db.table() == kept
    assert sum(row["rows"] for row in db.ledger(opened.run_id)) == len(gone)
    assert_run_clean(db, opened.run_id)
    assert app.cleanup.preview(POLICY).candidates == 0


# -- retain ---------------------------------------------------------------------------


def seed_retained(db: Db) -> dict[str, set[int]]:
    """ids 1..100 expired two hours ago, 101..200 half an hour ago, 201..250 live."""
    db.create_sessions()
    rows = [(i, -7200.0, False) for i in range(1, 101)]
    rows += [(i, -1800.0, False) for i in range(101, 201)]
    rows += [(i, LIVE, False) for i in range(201, 251)]
    db.insert_sessions(rows)
    return {"old": set(range(1, 101)), "recent": set(range(101, 201)), "live": set(range(201, 251))}


def test_retain_keeps_rows_expired_less_than_retain_ago(db: Db, apps: Apps) -> None:
    """retain = "1h": the cutoff is the database's now() minus an hour, so a row
    expired half an hour ago stays and one expired two hours ago goes."""
    rows = seed_retained(db)
    app = apps(db.url, {"retain": "1h"})
    assert app.cleanup is not None
    cleanup = app.cleanup

    # Before the run: an hour of lag behind the cutoff, and only the old rows.
    assert 3500 < cleanup.watermark(POLICY) < 3700
    preview = cleanup.preview(POLICY)
    assert preview.candidates == len(rows["old"])
    now = app.engine.now()
    assert timedelta(minutes=59) < now - preview.cutoff < timedelta(minutes=61)

    opened = cleanup.open_run(POLICY)
    assert timedelta(minutes=59) < now - opened.cutoff < timedelta(minutes=61)
    run_worker(app)

    assert db.ids() == rows["recent"] | rows["live"]
    assert sum(row["rows"] for row in db.ledger(opened.run_id)) == len(rows["old"])
    assert cleanup.watermark(POLICY) == 0
    assert_run_clean(db, opened.run_id)


# -- finishing a run ------------------------------------------------------------------


def assert_not_finished(db: Db, cleanup: Cleanup, run_id: str) -> None:
    """Both ways of finishing a run (after a batch, and the rescuer's sweep) leave it."""
    cleanup.finish_runs({run_id})
    assert cleanup.finish_idle_runs() == 0
    assert db.run_state(run_id) == "running"


def test_a_run_is_not_finished_while_a_window_is_pending(db: Db, apps: Apps) -> None:
    """A run is finished once none of its jobs is waiting or running: not right
    after planning, not while a window is claimed, not while one waits to retry."""
    all_ids, gone = seed(db)
    app = apps(db.url, {"nice_ratio": 0})  # the windows claimed at once, run one by one
    cleanup = app.cleanup
    assert cleanup is not None
    opened = cleanup.open_run(POLICY)
    claim_plan(app)  # its batch hook tries to finish the run: the windows are available
    assert db.run_state(opened.run_id) == "running"
    assert_not_finished(db, cleanup, opened.run_id)

    worker = app.worker()
    held, retrying, *rest = app.queue.claim(
        100, 60, owner="test-holder", queues=app.worked_queues()
    )
    assert rest and all(job.handler == WINDOW for job in (held, retrying, *rest))
    assert app.queue.fail(retrying, "boom") is JobState.RETRYABLE
    for job in rest:
        worker.process(job)  # each one's batch hook tries too
    assert_not_finished(db, cleanup, opened.run_id)  # one claimed, one to retry

    worker.process(held)
    assert_not_finished(db, cleanup, opened.run_id)  # one to retry

    db.execute("update expiry.jobs set run_at = {now} where key = %s", [retrying.key])
    [again] = app.queue.claim(100, 60, owner="test-holder", queues=app.worked_queues())
    assert again.key == retrying.key
    assert_not_finished(db, cleanup, opened.run_id)  # one claimed

    worker.process(again)  # the last window: its batch hook finishes the run
    assert db.run_state(opened.run_id) == "finished"
    assert db.ids() == all_ids - gone
    assert_run_clean(db, opened.run_id)


# -- the ledger guard -------------------------------------------------------------------


def expire_again(db: Db, lo: int, hi: int, gone: set[int]) -> set[int]:
    """Within (lo, hi]: put a deleted row back expired, expire a live row and
    un-revoke an expired one; each would go if the window were applied again."""
    back = min(i for i in gone if lo < i <= hi)
    live = min(i for i in db.ids() if lo < i <= hi and i % 5 == 0)
    revoked = min(i for i in db.ids() if lo < i <= hi and i % 5 != 0 and i % 7 == 0)
    db.insert_sessions([(back, -7200.0, False)])
    db.execute(
        f"update sessions set expires_at = {{now}} - {db.seconds('7200')} where id = %s", [live]
    )
    db.execute("update sessions set revoked_at = null where id = %s", [revoked])
    return {back, live, revoked}


def test_a_redelivered_window_takes_nothing_that_expired_since(db: Db, apps: Apps) -> None:
    """After a window committed, rows of its range that expire (or come back
    expired) are the next run's: a duplicate delivery leaves them, the ledger and
    the rest of the table as they were. (The ledger guard and the ledger's
    primary key each stop the duplicate alone; this catches losing both.)"""
    _, gone = seed(db)
    app = apps(db.url)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)
    assert_run_clean(db, opened.run_id)
    ledger = db.ledger()

    window = db.windows(opened.run_id)[1]
    lo, hi = window["payload"]["lo"], window["payload"]["hi"]
    expired_since = expire_again(db, lo, hi, gone)
    table = db.table()
    db.redeliver(window["key"])
    run_worker(app)

    assert db.table() == table
    assert expired_since <= db.ids()
    assert db.ledger() == ledger
    again = next(j for j in db.windows() if j["key"] == window["key"])
    assert (again["state"], again["attempt"]) == ("completed", 2)


def test_a_redelivered_window_does_not_wait_for_rows_locked_by_live_traffic(
    pg_db: Db, apps: Apps
) -> None:
    """A duplicate delivery is decided by the ledger before any row of the window
    is touched: a row lock held by live traffic does not hold it up."""
    db = pg_db
    _, gone = seed(db)
    app = apps(db.url, {"lock_timeout": "1s"})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)
    window = db.windows(opened.run_id)[1]
    lo, hi = window["payload"]["lo"], window["payload"]["hi"]
    expire_again(db, lo, hi, gone)
    table = db.table()

    with psycopg.connect(db.url) as locker:  # live traffic: a transaction left open
        locker.execute("select id from sessions where id > %s and id <= %s for update", (lo, hi))
        db.redeliver(window["key"])
        done = threading.Event()

        def work() -> None:
            run_worker(app)
            done.set()

        started = time.monotonic()
        thread = threading.Thread(target=work)
        thread.start()
        finished = done.wait(20)
        waited = time.monotonic() - started
        locker.rollback()
    thread.join(30)

    assert finished and waited < 5, f"the duplicate waited {waited:.1f}s for live traffic"
    again = next(j for j in db.windows() if j["key"] == window["key"])
    assert (again["state"], again["attempt"], again["kind"]) == ("completed", 2, None)
    assert db.table() == table
    assert db.audit("window.duplicate", window["key"]) == 1
