"""Runs of one policy take turns and never wait for each other.

A run waits only for an earlier run (by cutoff, then id) that has started;
runs not yet started coalesce into the newest, whose cutoff covers theirs.
The last test interleaves opens, partial work, abandoned claims and time
passing in any order, on every engine, and checks against its own reading
of the rows which are gone: every run ends, and every row expired before
the newest cutoff is gone while every other row stays.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import expiry.cleanup.planner
import expiry.cleanup.runs
import expiry.defaults
from expiry.app import App
from expiry.types import JobState

from ._support import LIVE, Db, claim_plan, drain, make_app, run_worker, standard_rows

Apps = Callable[..., App]
POLICY = "expired-sessions"


def test_two_runs_opened_before_any_worker_finish_in_one_pass(db: Db, apps: Apps) -> None:
    """The README's order: trigger, trigger again, then start a worker. The two
    runs waited for each other for ever; now the first gives way to the
    second, and one `worker --until-idle` pass deletes everything."""
    db.create_sessions()
    rows = standard_rows(300)
    db.insert_sessions(rows)
    app = apps(db.url)
    assert app.cleanup is not None
    now = app.engine.now().replace(microsecond=0)
    first = app.cleanup.open_run(POLICY, now - timedelta(seconds=2))
    second = app.cleanup.open_run(POLICY, now - timedelta(seconds=1))

    run_worker(app)  # one pass, no drain: nothing may be left waiting

    assert db.ids() == {i for i, offset, revoked in rows if offset > 0 or revoked}
    one, two = app.runs.summary(first.run_id), app.runs.summary(second.run_id)
    assert one is not None and two is not None
    assert (one["state"], one["superseded_by"]) == ("finished", second.run_id)
    assert one["outcome"] == f"superseded by {second.run_id}"
    assert (two["state"], two["outcome"]) == ("finished", "finished")
    assert two["rows_affected"] == len([r for r in rows if r[1] < 0 and not r[2]])
    assert db.audit("run.superseded") == 1
    assert app.queue.pending() == 0


def test_a_wait_follows_a_superseded_run_to_the_run_that_took_its_place(db: Db, apps: Apps) -> None:
    db.create_sessions()
    db.insert_sessions(standard_rows(50))
    app = apps(db.url)
    assert app.cleanup is not None
    now = app.engine.now().replace(microsecond=0)
    first = app.cleanup.open_run(POLICY, now - timedelta(seconds=2))
    second = app.cleanup.open_run(POLICY, now - timedelta(seconds=1))
    run_worker(app)

    summary = app.runs.wait(first.run_id, timeout=10)

    assert summary["id"] == second.run_id and summary["state"] == "finished"
    assert summary["supersedes"] == [first.run_id]


@pytest.mark.parametrize("old_rows", [300, 100])  # three windows pending, and exactly one
def test_a_run_waits_for_an_earlier_run_that_started_and_says_so(
    db: Db,
    apps: Apps,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    old_rows: int,
) -> None:
    monkeypatch.setattr(expiry.cleanup.planner, "OVERLAP_WAIT_SECONDS", 0.3)
    caplog.set_level(logging.INFO, logger="expiry")
    db.create_sessions()
    old = [(i, -7200.0, False) for i in range(1, old_rows + 1)]  # expired for both runs
    newer = [(i, -1800.0, False) for i in range(301, 501)]  # expired for the second only
    live = [(i, LIVE, False) for i in range(501, 601)]
    db.insert_sessions(old + newer + live)
    app = apps(db.url)
    assert app.cleanup is not None

    now = app.engine.now().replace(microsecond=0)
    first = app.cleanup.open_run(POLICY, now - timedelta(hours=1))
    claim_plan(app)  # the first run has started: its windows wait
    windows = old_rows // 100
    assert len(db.windows(first.run_id)) == windows
    second = app.cleanup.open_run(POLICY, now)

    jobs = app.queue.claim(100, 60, owner="test", queues=app.worked_queues())
    plan = next(j for j in jobs if j.payload["run_id"] == second.run_id)
    worker = app.worker()
    worker.process(plan)
    snoozed = app.queue.get(plan.key)
    assert snoozed is not None
    assert snoozed.state is JobState.SCHEDULED and snoozed.attempt == 0
    assert snoozed.wait_reason == (
        f"waiting for run {first.run_id}: {windows} of its jobs are pending"
    )
    assert snoozed.waiting_since is not None
    assert db.windows(second.run_id) == []
    assert db.run_state(second.run_id) == "planning"
    assert any(f"waiting for run {first.run_id}" in r.getMessage() for r in caplog.records)

    for job in jobs:
        if job.key != plan.key:
            worker.process(job)
    drain(app)

    assert db.ids() == {i for i, _, _ in live}
    for opened in (first, second):
        assert db.run_state(opened.run_id) == "finished"
    assert sum(row["rows"] for row in db.ledger(first.run_id)) == len(old)
    assert sum(row["rows"] for row in db.ledger(second.run_id)) == len(newer)


def test_a_run_supersedes_an_earlier_run_whose_jobs_only_wait_for_a_retry(
    db: Db, apps: Apps
) -> None:
    """An earlier run that started but only waits (its windows backing off after
    a lock timeout, a full disk) does not hold the policy's next run: the later
    run supersedes it (its waiting windows cancelled: the later cutoff covers
    their rows) and plans at once."""
    db.create_sessions()
    old = [(i, -7200.0, False) for i in range(1, 301)]
    live = [(i, LIVE, False) for i in range(301, 351)]
    db.insert_sessions(old + live)
    app = apps(db.url)
    assert app.cleanup is not None
    now = app.engine.now().replace(microsecond=0)
    first = app.cleanup.open_run(POLICY, now - timedelta(hours=1))
    claim_plan(app)
    for job in app.queue.claim(100, 60, owner="test", queues=app.worked_queues()):
        assert app.engine.job_fail(job, "lock timeout", "lock_timeout", 3600) is not None
    second = app.cleanup.open_run(POLICY, now)

    [plan] = app.queue.claim(100, 60, owner="test", queues=app.worked_queues())
    assert plan.payload["run_id"] == second.run_id
    app.worker().process(plan)

    planned = app.queue.get(plan.key)
    assert planned is not None and planned.state is JobState.COMPLETED
    one = app.runs.summary(first.run_id)
    assert one is not None and one["superseded_by"] == second.run_id
    assert one["state"] == "finished" and one["jobs_by_state"] == {"cancelled": 3}
    run_worker(app)
    assert db.ids() == {i for i, _, _ in live}
    assert db.run_state(second.run_id) == "finished"


def test_a_run_with_an_earlier_cutoff_never_waits_for_a_later_one(db: Db, apps: Apps) -> None:
    """Opened while a later cutoff's run works, an earlier cutoff plans at once:
    a run waits only for runs before it in cutoff order."""
    db.create_sessions()
    db.insert_sessions([(i, -7200.0, False) for i in range(1, 201)])
    app = apps(db.url)
    assert app.cleanup is not None
    now = app.engine.now().replace(microsecond=0)
    later = app.cleanup.open_run(POLICY, now)
    claim_plan(app)
    earlier = app.cleanup.open_run(POLICY, now - timedelta(minutes=30))

    jobs = app.queue.claim(100, 60, owner="test", queues=app.worked_queues())
    plan = next(j for j in jobs if j.payload["run_id"] == earlier.run_id)
    app.worker().process(plan)

    planned = app.queue.get(plan.key)
    assert planned is not None and planned.state is JobState.COMPLETED
    assert db.run_state(later.run_id) == "running"


# -- any order ---------------------------------------------------------------------

OPS = st.one_of(
    st.tuples(st.just("open"), st.integers(0, 4)),  # a cutoff 0-40 minutes back
    st.tuples(st.just("work"), st.integers(1, 6)),  # claim and run up to n due jobs
    st.just(("abandon", 1)),  # claim one job and drop it: a worker killed
    st.just(("tick", 0)),  # time passes: waits and leases end, the rescuer sweeps
)
_tables = itertools.count()


def _rows() -> list[tuple[int, float, bool]]:
    """Rows expiring every minute from 50 minutes ago to 10 minutes ahead, a
    revoked one every seventh, and some live for a day."""
    rows = [(i, -60.0 * (51 - i), i % 7 == 0) for i in range(1, 61)]
    return rows + [(i, LIVE, False) for i in range(61, 71)]


def _tick(app: App, db: Db) -> None:
    """Every wait ends now (each example's runs are of a policy of its own, and
    the examples before it left nothing waiting)."""
    db.execute("update expiry.jobs set run_at = {now} where state in ('scheduled', 'retryable')")
    db.execute(
        "update expiry.jobs set lease_expires_at = {now} - "
        + db.seconds("1")
        + " where state = 'running'"
    )
    app.queue.rescue()
    assert app.cleanup is not None
    app.cleanup.finish_idle_runs()


def _work(app: App, n: int) -> None:
    worker = app.worker()
    for job in app.queue.claim(n, 60, owner=worker.name, queues=app.worked_queues()):
        worker.process(job)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(OPS, min_size=2, max_size=9))
def test_runs_opened_worked_and_abandoned_in_any_order_all_end_and_clean(
    db: Db, ops: list[tuple[str, int]]
) -> None:
    table = f"sessions_{next(_tables)}"
    name = table.replace("_", "-")
    db.create_sessions(table)
    rows = _rows()
    db.insert_sessions(rows, table)
    app = make_app(db.url, {"name": name, "table": table, "window": 7})
    try:
        assert app.cleanup is not None
        base = app.engine.now().replace(microsecond=0)
        cutoffs = []
        for op, n in [("open", 0), *ops]:  # at least one run
            if op == "open":
                # Half a minute off the rows' whole minutes: no row sits at a cutoff.
                cutoff = base - timedelta(minutes=10 * n, seconds=30)
                cutoffs.append(cutoff)
                app.cleanup.open_run(name, cutoff)
            elif op == "work":
                _work(app, n)
            elif op == "abandon":
                app.queue.claim(n, 60, owner="killed", queues=app.worked_queues())
            else:
                _tick(app, db)
        for _ in range(200):  # then let time pass and the workers run until done
            _tick(app, db)
            _work(app, 50)
            if not db.scalar(
                "select count(*) from expiry.runs where policy = %s and state <> 'finished'",
                [name],
            ):
                break

        states = db.rows("select id, state from expiry.runs where policy = %s", [name])
        assert {state for _, state in states} == {"finished"}, (ops, states)
        # The oracle: a row expired before the newest cutoff (offsets are from
        # the table's insert, a moment before ``base``) is gone unless revoked.
        newest = max(cutoffs)
        seconds = (newest - base).total_seconds()
        expected = {i for i, offset, revoked in rows if offset >= seconds or revoked}
        assert db.ids(table) == expected, ops
        assert db.scalar("select count(*) from expiry.jobs where state = 'dead'") == 0
    finally:
        app.close()
