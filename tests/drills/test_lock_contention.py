"""Drill 3: live traffic holds row locks longer than the policy's lock_timeout.

Foreground transactions lock expired rows in several windows (SELECT ... FOR
UPDATE) and keep them for a few seconds. The windows that meet a lock give up
after lock_timeout (200 ms), record a lock_timeout error and retry within a
second, spending no attempt: the retry asks which rows are held (``for update
skip locked``) and cuts the window around them, the free rows taken, each held
row kept and booked as blocked. The run finishes while the locks stay; nothing
is dead-lettered; the policy's next run, once the locks went, takes the rows
they held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from expiry.app import App

from ._harness import connect, load_sessions, scale, wait_until
from ._invariants import check, record_expected

ROWS = scale(40_000, 1_000_000)
WINDOW = 500
HOLD = 2.0
"""Seconds the locks stay after every locked window has met its lock."""
LOCKED_WINDOWS = 4


def test_windows_behind_foreground_locks_retry_then_finish(
    pg_url: str, apps: Callable[..., App]
) -> None:
    load_sessions(pg_url, ROWS)
    record_expected(pg_url)
    app = apps(pg_url, {"window": WINDOW, "lock_timeout": "200ms", "max_attempts": 8})
    assert app.cleanup is not None
    opened = app.cleanup.open_run("expired-sessions")

    # Expired, unrevoked rows in four windows near the start of the key range
    # (every third window), so the workers reach them at any scale.
    victims = [
        next(i for i in range(1 + n * 3 * WINDOW, ROWS) if i % 5 and i % 7)
        for n in range(LOCKED_WINDOWS)
    ]
    locked = threading.Barrier(LOCKED_WINDOWS + 1)
    release = threading.Event()

    def hold(row_id: int) -> None:
        with connect(pg_url) as conn, conn.transaction():
            conn.execute("select * from sessions where id = %s for update", (row_id,))
            locked.wait()
            release.wait(120)

    holders = [threading.Thread(target=hold, args=(i,)) for i in victims]
    for thread in holders:
        thread.start()
    locked.wait()
    started = time.monotonic()

    worker = app.worker(concurrency=2, poll=0.05, rescue_every=0.5, name="drill-worker")
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        # The locks stay until every locked window has met its lock, and HOLD more.
        wait_until(
            lambda: _victims_met(pg_url, victims) == LOCKED_WINDOWS,
            scale(60, 600),
            "each locked window to time out on its lock",
        )
        # The run does not wait for the locks: it finishes around the held rows.
        wait_until(
            lambda: _run_state(pg_url, opened.run_id) == "finished",
            scale(60, 600),
            "the run to finish while the rows are held",
        )
        time.sleep(HOLD)
        assert _dead(pg_url) == 0
        with connect(pg_url) as conn:
            kept = conn.execute(
                "select count(*) from sessions where id = any(%s)", (victims,)
            ).fetchone()
        assert kept == (LOCKED_WINDOWS,)  # held: kept, never waited for
        release.set()
        for thread in holders:
            thread.join()
        following = app.cleanup.open_run("expired-sessions")  # the policy's next run
        _settle(pg_url)
    finally:
        release.set()
        worker.stop()
        runner.join(30)
        for thread in holders:
            thread.join()
    elapsed = time.monotonic() - started
    print(f"all windows done {elapsed:.1f}s after the locks were taken")
    assert _run_state(pg_url, following.run_id) == "finished"

    with connect(pg_url) as conn:
        blocked = conn.execute(
            """
            select key, attempt, errors from expiry.jobs
            where handler = 'expiry.window' and errors @> '[{"kind": "lock_timeout"}]'
            order by key
            """
        ).fetchall()
    print(f"{len(blocked)} windows met a lock: {[(k.rsplit(':', 1)[1], a) for k, a, _ in blocked]}")
    # Each locked row was met, by its window or by the rest of it queued after a
    # smaller retry had taken the part before the row.
    assert _victims_met(pg_url, victims) == LOCKED_WINDOWS
    assert len(blocked) >= LOCKED_WINDOWS, "each locked window should have met its lock"
    for key, attempt, errors in blocked:
        # Each retry, with half the rows, spent no attempt: the window's job ends
        # on its first, every timeout kept in its errors.
        assert attempt == 1 and len(errors) >= 1, (key, attempt, errors)
        assert {e["kind"] for e in errors} == {"lock_timeout"}, errors
        assert all("lock timeout" in e["error"] for e in errors), errors
    assert elapsed >= HOLD  # the held rows could not go before the locks did
    with connect(pg_url) as conn:
        kept = conn.execute(
            "select count(*) from expiry.ledger where run_id = %s and blocked is not null",
            (opened.run_id,),
        ).fetchone()
    assert kept == (LOCKED_WINDOWS,), "each held row is booked as blocked by the first run"

    report = check(pg_url)
    assert report.jobs == {"completed": report.jobs["completed"]}
    assert opened.run_id
    with connect(pg_url) as conn:
        gone = conn.execute("select count(*) from sessions where id = any(%s)", (victims,))
        assert gone.fetchone() == (0,)  # the locked rows went once the locks did


def _victims_met(url: str, victims: list[int]) -> int:
    """How many locked rows a window job met: its range holds the row and an
    attempt of it ended in a lock timeout."""
    with connect(url) as conn:
        row = conn.execute(
            "select count(distinct v) from unnest(%s::bigint[]) v join expiry.jobs j"
            " on j.handler = 'expiry.window'"
            """ and j.errors @> '[{"kind": "lock_timeout"}]'"""
            " and v > (j.payload->>'lo')::bigint and v <= (j.payload->>'hi')::bigint",
            (victims,),
        ).fetchone()
    return int(row[0]) if row else 0


def _settle(url: str) -> None:
    """Until no job is pending; none dead-lettered meanwhile."""
    deadline = time.monotonic() + scale(90, 600)
    while time.monotonic() < deadline:
        with connect(url) as conn:
            row = conn.execute(
                "select count(*) filter (where state not in ('completed', 'dead', 'cancelled')),"
                " count(*) filter (where state = 'dead') from expiry.jobs"
            ).fetchone()
        assert row is not None
        assert row[1] == 0, "a job was dead-lettered while its attempts lasted"
        if row[0] == 0:
            return
        time.sleep(0.2)
    raise AssertionError("jobs still pending")


def _run_state(url: str, run_id: str) -> str | None:
    with connect(url) as conn:
        row = conn.execute("select state from expiry.runs where id = %s", (run_id,)).fetchone()
    return None if row is None else str(row[0])


def _dead(url: str) -> int:
    with connect(url) as conn:
        row = conn.execute("select count(*) from expiry.jobs where state = 'dead'").fetchone()
    return int(row[0]) if row else 0
