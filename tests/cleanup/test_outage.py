"""A database outage is not a window's failure: a full disk (the database's own
error, raised by a trigger for a few seconds by the database's clock) fails a
window again and again, and with max_attempts = 2 the window still ends
completed, its rows gone, nothing dead-lettered; a deadlock in the same
place still spends attempts."""

from __future__ import annotations

import time
from collections.abc import Callable

from expiry.app import App

from ._support import Db, standard_rows

Apps = Callable[..., App]
POLICY = {"name": "full", "where": None, "max_attempts": 2, "window": 1000}

FAULT = {
    "postgres": [
        "create table outage (until timestamptz not null, kind text not null)",
        "create function outage_fault() returns trigger language plpgsql as $$"
        " begin"
        "   if now() < (select until from outage) then"
        "     if (select kind from outage) = 'disk_full' then"
        "       raise exception 'could not extend file: No space left on device'"
        "         using errcode = 'disk_full';"
        "     end if;"
        "     raise exception 'deadlock detected' using errcode = 'deadlock_detected';"
        "   end if;"
        "   return null;"
        " end $$",
        "create trigger outage_fault before delete on sessions"
        " for each statement execute function outage_fault()",
    ],
    "mysql": [
        "create table outage (until datetime(6) not null, kind text not null)",
        "create trigger outage_fault before delete on sessions for each row begin"
        " if utc_timestamp(6) < (select until from outage) then"
        "   if (select kind from outage) = 'disk_full' then"
        "     signal sqlstate 'HY000' set mysql_errno = 1021, message_text = 'Disk full';"
        "   end if;"
        "   signal sqlstate '40001' set mysql_errno = 1213, message_text = 'Deadlock found';"
        " end if; end",
    ],
    "sqlite": [
        "create table outage (until real not null, kind text not null)",
        "create trigger outage_fault before delete on sessions"
        " when {now} < (select until from outage) begin"
        " select case (select kind from outage)"
        "   when 'disk_full' then raise(abort, 'database or disk is full')"
        "   else raise(abort, 'constraint failed: not an outage') end;"
        " end",
    ],
}


def _outage(db: Db, kind: str, seconds: float) -> None:
    for statement in FAULT[db.dialect]:
        db.execute(statement) if db.dialect != "sqlite" else db.conn.execute(db.sql(statement))
    db.execute(
        "insert into outage (until, kind) values ({now} + " + db.seconds(str(seconds)) + ", %s)",
        [kind],
    )


def _work_until(app: App, db: Db, deadline: float) -> None:
    """Run whatever is due, making every retry due at once, until ``deadline``
    (monotonic) and then until nothing is pending."""
    worker = app.worker()
    while time.monotonic() < deadline or app.queue.pending():
        for job in app.queue.claim(10, 60, owner=worker.name, queues=app.worked_queues()):
            worker.process(job)
        db.execute("update expiry.jobs set run_at = {now} where state = 'retryable'")
        time.sleep(0.05)
        if time.monotonic() > deadline + 30:
            break


def test_a_full_disk_fails_a_window_many_times_and_spends_no_attempt(db: Db, apps: Apps) -> None:
    db.create_sessions()
    rows = standard_rows(200)
    db.insert_sessions(rows)
    _outage(db, "disk_full", 2.5)
    app = apps(db.url, POLICY)
    assert app.cleanup is not None
    opened = app.cleanup.open_run("full")

    _work_until(app, db, time.monotonic() + 2.5)

    [window] = db.windows(opened.run_id)
    job = app.queue.get(window["key"])
    assert job is not None and job.state.value == "completed", job
    kinds = [e["kind"] for e in job.errors]
    assert len(kinds) > 2 and set(kinds) == {"disk_full"}, kinds  # more failures than attempts
    assert db.ids() == {i for i, off, _ in rows if off > 0}
    assert db.run_state(opened.run_id) == "finished"
    assert db.scalar("select count(*) from expiry.jobs where state = 'dead'") == 0


def test_another_failure_in_the_same_place_still_spends_attempts(db: Db, apps: Apps) -> None:
    db.create_sessions()
    db.insert_sessions(standard_rows(200))
    _outage(db, "deadlock", 2.5)
    app = apps(db.url, POLICY)
    assert app.cleanup is not None
    opened = app.cleanup.open_run("full")

    _work_until(app, db, time.monotonic() + 2.5)

    [window] = db.windows(opened.run_id)
    job = app.queue.get(window["key"])
    assert job is not None and job.state.value == "dead", job
    assert 1 <= job.attempt <= 2 and len(job.errors) == job.attempt
