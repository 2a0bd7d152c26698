"""Group commit: jobs of a ``group_commit`` handler claimed together run in one
transaction that completes them all; any failure in the group rolls it back and
each job runs again alone, so one job's outcome never decides another's."""

from __future__ import annotations

import random
from typing import Any

import pytest
from _support import execute, expire_leases, placeholder

from expiry.app import App
from expiry.errors import ConfigError, PermanentError
from expiry.queue.handlers import Handler
from expiry.queue.jobs import new_job
from expiry.queue.worker import Worker
from expiry.types import Job, JobState


def make_worker(app: App, **kwargs: Any) -> Worker:
    options: dict[str, Any] = {
        "until_idle": True,
        "claim_hold": None,  # claim the whole batch at once
        "poll": 0.05,
        "rescue_every": 3600,
        "rng": random.Random(0),
    }
    return app.worker(**{**options, **kwargs})


def setup_effects(app: App) -> str:
    execute(app.engine, "create table effects (job text not null, txn text not null)")
    return placeholder(app.engine)


def effects(app: App) -> list[tuple[str, str]]:
    return [(r["job"], r["txn"]) for r in execute(app.engine, "select job, txn from effects")]


def txn_marker(app: App) -> str:
    """SQL naming the current transaction (PostgreSQL's txid; SQLite has none)."""
    return "txid_current()::text" if app.engine.dialect == "postgres" else "'-'"


def state(app: App, key: str) -> Job:
    job = app.queue.get(key)
    assert job is not None
    return job


def test_a_group_runs_in_one_transaction_and_completes_together(app: App) -> None:
    mark = setup_effects(app)
    marker = txn_marker(app)

    @app.handler("record", group_commit=True)
    def record(job: Job, tx: Any) -> None:
        tx.execute(f"insert into effects (job, txn) values ({mark}, {marker})", (job.key,))

    app.queue.enqueue_many(new_job("record", {}, None, f"r{i}") for i in range(10))
    worker = make_worker(app, batch=10)
    assert worker.run() == 0

    rows = effects(app)
    assert sorted(job for job, _ in rows) == sorted(f"r{i}" for i in range(10))
    if app.engine.dialect == "postgres":
        assert len({txn for _, txn in rows}) == 1  # one transaction for the ten
    done = [state(app, f"r{i}") for i in range(10)]
    assert all(j.state is JobState.COMPLETED and j.attempt == 1 for j in done)
    # One completing statement: one database time for all ten.
    assert len({j.finished_at for j in done}) == 1
    assert worker.processed == 10


def test_handlers_without_group_commit_still_commit_one_job_at_a_time(app: App) -> None:
    mark = setup_effects(app)
    marker = txn_marker(app)

    @app.handler("record")
    def record(job: Job, tx: Any) -> None:
        tx.execute(f"insert into effects (job, txn) values ({mark}, {marker})", (job.key,))

    app.queue.enqueue_many(new_job("record", {}, None, f"r{i}") for i in range(5))
    assert make_worker(app, batch=5).run() == 0

    rows = effects(app)
    assert len(rows) == 5
    if app.engine.dialect == "postgres":
        assert len({txn for _, txn in rows}) == 5


def test_one_failing_job_rolls_the_group_back_and_each_job_reruns_alone(app: App) -> None:
    mark = setup_effects(app)
    runs: list[str] = []

    @app.handler("record", group_commit=True)
    def record(job: Job, tx: Any) -> None:
        runs.append(job.key)
        tx.execute(f"insert into effects (job, txn) values ({mark}, 'x')", (job.key,))
        if job.payload.get("bad"):
            raise PermanentError("row 3 is malformed")

    jobs = [new_job("record", {"bad": i == 3}, None, f"r{i}") for i in range(6)]
    app.queue.enqueue_many(jobs)
    assert make_worker(app, batch=6).run() == 0

    # The group ran to r3 and rolled back; then each job ran alone.
    assert runs == ["r0", "r1", "r2", "r3"] + [f"r{i}" for i in range(6)]
    # Effects exactly once for the good jobs, none for the bad one.
    assert sorted(job for job, _ in effects(app)) == ["r0", "r1", "r2", "r4", "r5"]
    for i in (0, 1, 2, 4, 5):
        assert (state(app, f"r{i}").state, state(app, f"r{i}").attempt) == (JobState.COMPLETED, 1)
    bad = state(app, "r3")
    assert bad.state is JobState.DEAD and bad.attempt == 1
    assert "row 3 is malformed" in (bad.last_error or "")


def test_a_repeat_inside_a_group_completes_as_a_duplicate_without_a_second_effect(
    app: App,
) -> None:
    mark = setup_effects(app)

    @app.handler("once", group_commit=True)
    def once(job: Job, tx: Any) -> None:
        with app.once(tx, f"op:{job.payload['op']}"):
            tx.execute(f"insert into effects (job, txn) values ({mark}, 'x')", (job.key,))

    app.queue.enqueue_many(new_job("once", {"op": op}, None, f"j{op}") for op in range(4))
    assert make_worker(app, batch=4).run() == 0
    # The same operations again, under new job keys (a duplicate delivery).
    app.queue.enqueue_many(new_job("once", {"op": op}, None, f"again{op}") for op in (1, 2, 7))
    assert make_worker(app, batch=4).run() == 0

    assert sorted(job for job, _ in effects(app)) == ["again7", "j0", "j1", "j2", "j3"]
    for key in ("again1", "again2", "again7"):
        assert state(app, key).state is JobState.COMPLETED


def test_a_lost_lease_in_a_group_completes_none_of_it(app: App) -> None:
    mark = setup_effects(app)

    @app.handler("record", group_commit=True)
    def record(job: Job, tx: Any) -> None:
        tx.execute(f"insert into effects (job, txn) values ({mark}, 'x')", (job.key,))

    app.queue.enqueue_many(new_job("record", {}, None, f"r{i}") for i in range(3))
    worker = make_worker(app, batch=3)
    jobs = app.queue.claim(3, 30, owner=worker.name)
    expire_leases(app.engine)  # the worker stalled past its leases
    worker._process_group(jobs)

    # The group rolled back, and so did each job alone: nothing took effect and
    # nothing completed; the rescuer hands them out again.
    assert effects(app) == []
    assert all(state(app, f"r{i}").state is JobState.RUNNING for i in range(3))
    assert app.queue.rescue() == 3
    assert make_worker(app, batch=3).run() == 0
    assert sorted(job for job, _ in effects(app)) == ["r0", "r1", "r2"]


def test_a_handler_that_completes_its_own_job_cannot_join_a_group(app: App) -> None:
    with pytest.raises(ConfigError, match="must not complete its own job"):
        app.register(Handler("both", lambda job, tx: None, group_commit=True, completes_job=True))
    assert "both" not in app.handlers


def test_a_handler_without_a_transaction_cannot_join_a_group(app: App) -> None:
    with pytest.raises(ConfigError, match="must be transactional"):
        app.handler("both", group_commit=True, transactional=False)(lambda job: None)
    assert "both" not in app.handlers
