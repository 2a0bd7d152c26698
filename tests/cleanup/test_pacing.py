"""Pacing of window transactions: keys per transaction adapt toward
target_transaction, and max_rows_per_second and nice_ratio rest the policy
after each one (its next window waits in the queue; no thread is held)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from expiry.app import App
from expiry.cleanup.jobs import WindowResult
from expiry.cleanup.pacing import MIN_CHUNK
from expiry.cleanup.runs import WINDOW
from expiry.config import parse_config
from expiry.errors import ConfigError, Snooze
from expiry.queue.jobs import policy_queue
from expiry.types import Job

from ._support import (
    Db,
    MySQLConn,
    config_data,
    doomed,
    run_worker,
    standard_rows,
    wait_for,
)

Apps = Callable[..., App]
POLICY = "expired-sessions"


def window_job(app: App) -> Job:
    """A window job of the policy, as a worker holds it."""
    app.queue.enqueue(WINDOW, {"policy": POLICY, "run_id": f"{POLICY}:t", "lo": 0, "hi": 1})
    [job] = app.queue.claim(1, 60, owner="test", queues=app.worked_queues())
    return job


def timed(fn: Callable[[], None]) -> float:
    began = time.monotonic()
    fn()
    return time.monotonic() - began


def resting_for(app: App) -> float:
    """Seconds until the policy's queue may be claimed from again (0: open)."""
    assert app.cleanup is not None
    until = app.cleanup.gates().resting.get(policy_queue(POLICY), 0.0)
    return max(0.0, until - time.monotonic())


def test_nice_ratio_rests_the_policy_not_the_thread(db: Db, apps: Apps) -> None:
    db.create_sessions()
    nice, eager = apps(db.url, {"nice_ratio": 2}), apps(db.url, {"nice_ratio": 0})
    assert nice.cleanup is not None and eager.cleanup is not None
    job = window_job(nice)
    applied = WindowResult(POLICY, 500)

    # The thread goes on at once; the policy's queue rests 2 x 0.1 s.
    assert timed(lambda: nice.cleanup.after_window(job, applied, 0.1)) < 0.05  # type: ignore[union-attr]
    assert 0.15 <= resting_for(nice) <= 0.2
    assert nice.cleanup.gates().limits == {policy_queue(POLICY): 1}
    # The rest holds back claims; a window claimed before it began still runs.
    nice.cleanup.before_window(job)

    eager.cleanup.after_window(job, applied, 0.1)
    assert resting_for(eager) == 0.0
    assert eager.cleanup.gates().limits == {}  # unpaced: claimed as many as fit
    eager.cleanup.before_window(job)  # nothing to wait for
    # A duplicate (no rows) took nothing from the database: no rest.
    time.sleep(0.2)
    nice.cleanup.after_window(job, WindowResult(POLICY, None), 0.1)
    assert resting_for(nice) == 0.0


def applications_statement(db: Db, seconds: float, done: threading.Event) -> threading.Thread:
    """A session of the application running a statement for ``seconds`` (not
    one of expiry's: another application_name, no expiry table named), its
    connection kept open, idle, until ``done``."""

    def run() -> None:
        if db.dialect == "mysql":
            other = MySQLConn(db.url)
            other.execute(f"select sleep({seconds})").fetchall()
            done.wait(10)
            other.close()
            return
        with psycopg.connect(db.url, autocommit=True, application_name="shop") as conn:
            conn.execute(f"select pg_sleep({seconds})")
            done.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    return thread


@pytest.mark.serial  # whether the server's sessions are at work: the other tests' would be
def test_nice_ratio_rests_while_the_application_is_at_work_and_not_on_a_quiet_database(
    db: Db, apps: Apps
) -> None:
    """nice_when "busy" (the default): the rest gives the database back to the
    application's sessions, so it is taken while the health check last saw one
    at work, and not when it saw none. "always" rests on a quiet database too.
    SQLite cannot say: it always rests."""
    db.create_sessions()
    app = apps(db.url, {"nice_ratio": 2})
    always = apps(db.url, {"nice_ratio": 2, "nice_when": "always"})
    assert app.cleanup is not None and app.health is not None and always.cleanup is not None
    job, applied = window_job(app), WindowResult(POLICY, 500)
    time.sleep(1.2)  # the test's own set-up statements out of the last second
    # expiry's own connections at work just now (another thread's: another
    # connection than the check's): not the application's.
    other = threading.Thread(target=app.engine.now)
    other.start()
    other.join()
    app.health.check()
    if db.dialect == "sqlite":
        assert not app.health.quiet()
        app.cleanup.after_window(job, applied, 0.1)
        assert 0.15 <= resting_for(app) <= 0.2
        return
    assert app.health.quiet()
    app.cleanup.after_window(job, applied, 0.1)
    assert resting_for(app) == 0.0  # no one to give the database back to
    assert app.cleanup.gates().limits == {}  # claimed in batches, as an unpaced policy's
    always.cleanup.after_window(job, applied, 0.1)
    assert 0.15 <= resting_for(always) <= 0.2

    done = threading.Event()
    working = applications_statement(db, 1.0, done)
    app.health.check()
    assert not app.health.quiet()
    app.cleanup.after_window(job, applied, 0.1)
    assert 0.15 <= resting_for(app) <= 0.2  # under load: as always
    assert app.cleanup.gates().limits == {policy_queue(POLICY): 1}  # one window a claim
    time.sleep(0.6)  # its statement ended just now: at work within the last second
    app.health.check()
    assert not app.health.quiet()
    time.sleep(1.6)  # idle for over a second: quiet again
    app.health.check()
    assert app.health.quiet()
    done.set()
    working.join()


def test_a_check_that_fails_or_is_late_counts_as_busy(db: Db, apps: Apps) -> None:
    """No reading, a failed one, or one older than two health intervals: the
    policy rests, as it would under load."""
    db.create_sessions()
    app = apps(db.url, {"nice_ratio": 2, "health_interval": "50ms"})
    assert app.health is not None
    assert not app.health.quiet()  # never checked
    app.health.check()
    if db.dialect == "sqlite":
        assert not app.health.quiet()  # cannot say
        return
    time.sleep(0.15)  # three intervals: the reading is stale
    assert not app.health.quiet()


def test_max_rows_per_second_rests_the_policy_for_the_rows_taken(db: Db, apps: Apps) -> None:
    db.create_sessions()
    app = apps(db.url, {"max_rows_per_second": 1000, "nice_ratio": 0})
    assert app.cleanup is not None
    job = window_job(app)
    app.cleanup.check()  # the table's check, which before_window runs once, done here
    began = time.monotonic()
    app.cleanup.after_window(job, WindowResult(POLICY, 300), 0.01)

    assert 0.25 <= resting_for(app) <= 0.3  # 300 rows at 1,000 rows/s
    # A promise: a window claimed meanwhile goes back to the queue until then.
    with pytest.raises(Snooze) as snoozed:
        app.cleanup.before_window(job)
    since = time.monotonic() - began
    # The rest began somewhere inside after_window (a loaded machine takes a few
    # ms there): what is left of it is at most the whole rest, and at least the
    # rest less everything since before after_window.
    assert 0.3 - since - 0.005 <= snoozed.value.delay <= 0.3 + 0.001


def test_a_resting_policy_holds_back_its_windows_not_the_thread_that_ran_them(
    db: Db, apps: Apps
) -> None:
    """One worker thread, a throttled policy and a second one: the second's
    first window starts within a second of the first policy's window, while
    the first policy's next window waits in the queue for its rest."""
    db.create_sessions()
    db.create_sessions("tokens")
    db.insert_sessions(standard_rows(300))
    db.insert_sessions(standard_rows(300), table="tokens")
    throttled = {"max_rows_per_second": 20, "nice_ratio": 0}  # ~100 rows: a 5 s rest
    other = {"name": "expired-tokens", "table": "tokens", "nice_ratio": 0}
    app = apps(db.url, throttled, other)
    assert app.cleanup is not None
    first = app.cleanup.open_run(POLICY)
    worker = app.worker(concurrency=1, poll=0.05, rescue_every=3600)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: len(db.ledger(first.run_id)) >= 1, timeout=30)
        opened = time.monotonic()
        second = app.cleanup.open_run("expired-tokens")
        wait_for(lambda: db.ledger(second.run_id), timeout=10)
        started_in = time.monotonic() - opened
        wait_for(lambda: db.run_state(second.run_id) == "finished", timeout=10)
        assert len(db.ledger(first.run_id)) == 1  # still resting: its next window waits
        waiting = [j for j in db.jobs(run_id=first.run_id) if j["state"] != "completed"]
        assert waiting and all(j["state"] in ("available", "scheduled") for j in waiting)
    finally:
        worker.stop()
        thread.join(30)
    assert started_in < 1.0


def test_keys_per_transaction_halve_when_slow_and_grow_back_when_fast(db: Db, apps: Apps) -> None:
    db.create_sessions()
    app = apps(db.url, {"window": 1000, "target_transaction": "100ms", "nice_ratio": 0})
    assert app.cleanup is not None
    job = window_job(app)
    chunk = app.cleanup._pace(app.cleanup.policy(POLICY))
    applied = WindowResult(POLICY, 50)

    app.cleanup.after_window(job, applied, 0.2)  # past 1.5x the target
    assert chunk.chunk == 500
    for _ in range(10):
        app.cleanup.after_window(job, applied, 0.2)
    assert chunk.chunk == MIN_CHUNK
    app.cleanup.after_window(job, applied, 0.1)  # within the target: unchanged
    assert chunk.chunk == MIN_CHUNK
    app.cleanup.after_window(job, applied, 0.01)  # well under it: doubles
    assert chunk.chunk == 2 * MIN_CHUNK
    for _ in range(10):
        app.cleanup.after_window(job, applied, 0.01)
    assert chunk.chunk == 1000  # never past the policy's window


def test_windows_taken_in_halved_chunks_delete_exactly_the_expired_rows(db: Db, apps: Apps) -> None:
    """The policy's transactions were slow: its windows are taken in chunks from
    MIN_CHUNK keys up (each part booked on its own, the rest continued); the
    table ends as the oracle says and the ledger counts every row once."""
    db.create_sessions()
    rows = standard_rows(1200)
    db.insert_sessions(rows)
    gone = doomed(rows)
    app = apps(db.url, {"window": 1000, "nice_ratio": 0})
    assert app.cleanup is not None
    app.cleanup._pace(app.cleanup.policy(POLICY)).chunk = MIN_CHUNK  # as after slow windows
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)
    assert db.ids() == {i for i, _, _ in rows} - gone
    ledger = db.ledger(opened.run_id)
    assert sum(row["rows"] for row in ledger) == len(gone)
    assert len(ledger) > 2, "the windows were taken in chunks"
    spans = sorted((row["lo"], row["hi"]) for row in ledger)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), "the parts do not overlap"


def test_a_negative_nice_ratio_is_refused_naming_the_policy_and_field(db: Db) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(config_data(db.url, {"nice_ratio": -1}))
    message = str(refused.value)
    assert POLICY in message and "nice_ratio" in message


def test_a_resting_thread_does_not_heartbeat_the_window_it_finished(
    db: Db, apps: Apps, caplog: pytest.LogCaptureFixture
) -> None:
    db.create_sessions()
    db.insert_sessions(standard_rows(300))
    # Rests (100 times a window's time) longer than a heartbeat period; a lease
    # long enough that a loaded machine's late heartbeat does not lose a window
    # that still runs (0.6 s did under make test's three processes).
    app = apps(db.url, {"nice_ratio": 100, "nice_when": "always"})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    caplog.set_level(logging.WARNING, logger="expiry")
    run_worker(app, lease=1.2)  # heartbeats every 0.4 s

    assert db.run_state(opened.run_id) == "finished"
    assert not [r for r in caplog.records if "lease lost" in r.getMessage()]
