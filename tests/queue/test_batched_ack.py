"""Batched acknowledgement: a ``batched_ack`` handler runs outside any
transaction and the worker completes its jobs many to a transaction, at most
``ack_delay`` after the first of them finished. Until then a job is still leased,
so a crash runs it again (at least once); a shutdown acknowledges what ran."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _support import execute, finish, spawn, wait_for

from expiry.app import App
from expiry.errors import ConfigError
from expiry.queue.handlers import Handler
from expiry.queue.jobs import new_job
from expiry.queue.worker import Worker
from expiry.types import Job, JobState


def make_worker(app: App, **kwargs: Any) -> Worker:
    options: dict[str, Any] = {
        "claim_hold": None,  # claim the whole batch at once
        "poll": 0.05,
        "rescue_every": 3600,
        "rng": random.Random(0),
    }
    return app.worker(**{**options, **kwargs})


def states(app: App, keys: list[str]) -> list[JobState]:
    found = [app.queue.get(key) for key in keys]
    assert all(job is not None for job in found)
    return [job.state for job in found if job is not None]


def finished_at(app: App, keys: list[str]) -> set[object]:
    return {job.finished_at for key in keys if (job := app.queue.get(key)) is not None}


def test_a_batch_is_acknowledged_in_one_transaction_after_the_delay(app: App) -> None:
    ran: list[str] = []
    done = threading.Event()
    release = threading.Event()

    @app.handler("touch", transactional=False, batched_ack=True)
    def touch(job: Job) -> None:
        ran.append(job.key)
        if len(ran) == 5:
            done.set()

    @app.handler("hold", transactional=False)
    def hold(job: Job) -> None:  # the flusher acknowledges while the loop is busy here
        release.wait(10)

    keys = [f"t{i}" for i in range(5)]
    app.queue.enqueue_many(new_job("touch", {}, None, key) for key in keys)
    app.queue.enqueue("hold", {}, None, "h")
    worker = make_worker(app, batch=10, ack_delay=1.0)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert done.wait(10)
        ran_at = time.monotonic()
        # The handlers returned; the jobs stay leased until their batch commits.
        assert states(app, keys) == [JobState.RUNNING] * 5
        wait_for(lambda: states(app, keys) == [JobState.COMPLETED] * 5, 10, "the batch's ack")
        waited = time.monotonic() - ran_at
        assert states(app, ["h"]) == [JobState.RUNNING]  # the flusher acked, not the loop
    finally:
        release.set()
        worker.stop()
        thread.join(10)
    assert sorted(ran) == keys  # each ran once
    assert len(finished_at(app, keys)) == 1  # one statement completed the five
    assert 0.5 < waited < 1.0 + 0.5  # about the delay
    assert worker.processed == 6


def test_a_batch_that_does_not_fill_is_acknowledged_after_the_delay_not_later(app: App) -> None:
    """The flusher, idle with nothing pending, hears of a batch's first job: it
    commits ``ack_delay`` (0.1 s) after it, not at its next idle check (0.5 s)."""
    done = threading.Event()
    release = threading.Event()

    @app.handler("touch", transactional=False, batched_ack=True)
    def touch(job: Job) -> None:
        done.set()

    @app.handler("hold", transactional=False)
    def hold(job: Job) -> None:  # keeps the job loop busy: only the flusher acks
        release.wait(10)

    app.queue.enqueue("touch", {}, None, "t")
    app.queue.enqueue("hold", {}, None, "h")
    worker = make_worker(app, batch=10, ack_delay=0.1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert done.wait(10)
        ran_at = time.monotonic()
        wait_for(lambda: states(app, ["t"]) == [JobState.COMPLETED], 10, "the ack")
        waited = time.monotonic() - ran_at
    finally:
        release.set()
        worker.stop()
        thread.join(10)
    assert waited < 0.3


def test_a_worker_run_until_idle_acknowledges_at_once(app: App) -> None:
    """With nothing more to run, a draining worker does not sit out the delay."""

    @app.handler("touch", transactional=False, batched_ack=True)
    def touch(job: Job) -> None:
        return None

    keys = [f"t{i}" for i in range(3)]
    app.queue.enqueue_many(new_job("touch", {}, None, key) for key in keys)
    worker = make_worker(app, batch=10, ack_delay=30.0, until_idle=True)
    started = time.monotonic()
    assert worker.run() == 0
    assert time.monotonic() - started < 10  # not the 30 s delay
    assert states(app, keys) == [JobState.COMPLETED] * 3


def test_a_full_batch_is_acknowledged_without_waiting(app: App) -> None:
    seen: list[str] = []

    @app.handler("touch", transactional=False, batched_ack=True)
    def touch(job: Job) -> None:
        seen.append(job.key)

    keys = [f"t{i:02d}" for i in range(8)]
    app.queue.enqueue_many(new_job("touch", {}, None, key) for key in keys)
    worker = make_worker(app, batch=4, ack_delay=30.0)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        # Two claims of 4: each fills a batch, which commits well before the delay.
        wait_for(lambda: states(app, keys) == [JobState.COMPLETED] * 8, 10, "the full batches")
    finally:
        worker.stop()
        thread.join(10)
    assert 1 <= len(finished_at(app, keys)) <= 2  # in batches (the flusher may take both)
    assert sorted(seen) == keys


def test_a_stopping_worker_acknowledges_what_it_ran(app: App) -> None:
    done = threading.Event()

    @app.handler("touch", transactional=False, batched_ack=True)
    def touch(job: Job) -> None:
        done.set()

    app.queue.enqueue("touch", {}, None, "t0")
    worker = make_worker(app, batch=10, ack_delay=30.0)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert done.wait(10)
    assert states(app, ["t0"]) == [JobState.RUNNING]
    worker.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert states(app, ["t0"]) == [JobState.COMPLETED]


def test_a_lost_lease_in_a_batch_does_not_hold_back_the_others(app: App) -> None:
    ran = threading.Event()
    go = threading.Event()

    @app.handler("touch", transactional=False, batched_ack=True)
    def touch(job: Job) -> None:
        if job.key == "t2":
            ran.set()
            go.wait(10)

    keys = ["t0", "t1", "t2"]
    app.queue.enqueue_many(new_job("touch", {}, None, key) for key in keys)
    worker = make_worker(app, batch=10, ack_delay=0.2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert ran.wait(10)
        # Another owner took t1 meanwhile (its lease expired and was claimed again).
        execute(
            app.engine, "update expiry.jobs set lease_token = %s where key = %s", ("theirs", "t1")
        )
        go.set()
        wait_for(lambda: states(app, ["t0", "t2"]) == [JobState.COMPLETED] * 2, 10, "the others")
    finally:
        worker.stop()
        thread.join(10)
    assert states(app, ["t1"]) == [JobState.RUNNING]  # the other owner's to finish


def test_batched_ack_needs_a_handler_without_a_transaction() -> None:
    with pytest.raises(ConfigError, match="batched_ack.*transactional=False"):
        Handler("x", lambda job, tx: None, batched_ack=True)


def test_a_crash_before_the_ack_runs_the_batch_again(db_url: str, app: App, tmp_path: Path) -> None:
    """At least once: the worker dies after its handlers ran and before their
    batch committed; the jobs' leases expire and another worker runs them again."""
    keys = [f"b{i}" for i in range(3)]
    app.queue.enqueue_many(new_job("batched", {}, None, key) for key in keys)
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = spawn("worker", db_url, "--lease", "1", "--marks", str(marks), "--ack-delay", "60")
    wait_for(
        lambda: all((marks / f"{key}.1.started").exists() for key in keys),
        what="the three handlers to run",
    )
    time.sleep(0.3)  # a batch acknowledged early would show by now
    assert states(app, keys) == [JobState.RUNNING] * 3
    proc.send_signal(signal.SIGKILL)
    code, _ = finish(proc)
    assert code == -signal.SIGKILL
    assert states(app, keys) == [JobState.RUNNING] * 3  # never acknowledged

    second = spawn(
        "worker",
        db_url,
        "--lease",
        "1",
        "--marks",
        str(marks),
        "--until-idle",
        "--ack-delay",
        "0.05",
    )
    code, err = finish(second)
    assert code == 0, err
    for key in keys:  # ran twice, completed once, on the second attempt
        assert (marks / f"{key}.2.started").exists()
        job = app.queue.get(key)
        assert job is not None and job.state is JobState.COMPLETED and job.attempt == 2
