"""Claiming ahead (``claim_ahead=True``): a loop whose claim came back full of short jobs claims its
next batch while it runs this one, where the engine has concurrent writers
(PostgreSQL, MySQL; not SQLite). The batch claimed ahead is held under lease
meanwhile; it goes back unrun, its attempt unspent, at shutdown or when its
queue has come to rest; a paced queue (a claim limit) is never claimed ahead.

Each handler's first job watches the jobs table from outside (its own
transactions) for the claim ahead: ``running`` jobs beyond its own batch."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import pytest
from _support import execute

from expiry.app import App
from expiry.queue.jobs import new_job
from expiry.queue.runner import Hooks, WorkerSettings
from expiry.queue.worker import Worker
from expiry.types import Gates, Job, JobState

BATCH = 5


def running(app: App) -> int:
    rows = execute(app.engine, "select count(*) as n from expiry.jobs where state = 'running'")
    return int(rows[0]["n"])


def watch_running(app: App, at_least: int, seconds: float) -> int:
    """The jobs running once ``at_least`` are, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while (n := running(app)) < at_least and time.monotonic() < deadline:
        time.sleep(0.01)
    return n


def worker(app: App, hooks: Hooks | None = None, **kwargs: Any) -> Worker:
    """A worker with a fixed claim of BATCH (no sizing by job time), until idle."""
    options: dict[str, Any] = {
        "batch": BATCH,
        "claim_hold": None,
        "until_idle": True,
        "poll": 0.05,
        "rescue_every": 3600,
        "queues": ("default",),
        "pools": {},
        "claim_ahead": True,
    }
    settings = WorkerSettings(**{**options, **kwargs})
    return Worker(app.engine, app.queue, app.handlers, hooks, settings, rng=random.Random(0))


def watched(app: App, seconds: float) -> list[int]:
    """Register the "watch" handler: its first job records the jobs running once
    a second batch is (or after ``seconds``). The list it fills."""
    seen: list[int] = []

    @app.handler("watch", transactional=False)
    def watch(job: Job) -> None:
        if job.payload["i"] == 0:
            seen.append(watch_running(app, 2 * BATCH, seconds))

    return seen


def enqueue(app: App, n: int) -> None:
    app.queue.enqueue_many(new_job("watch", {"i": i}, None, f"j{i}") for i in range(n))


def states(app: App) -> dict[str, tuple[JobState, int]]:
    found = {}
    for i in range(30):
        job = app.queue.get(f"j{i}")
        assert job is not None
        found[job.key] = (job.state, job.attempt)
    return found


def test_a_full_batch_has_the_next_claimed_while_it_runs(app: App) -> None:
    seen = watched(app, 2.0)

    enqueue(app, 30)
    w = worker(app)
    assert w.run() == 0

    ahead = app.engine.concurrent_writers
    assert seen == [2 * BATCH if ahead else BATCH]
    assert w.processed == 30
    assert states(app) == {f"j{i}": (JobState.COMPLETED, 1) for i in range(30)}


def test_without_claim_ahead_a_loop_holds_one_batch(app: App) -> None:
    """The default: a loop claims its next batch once this one has run."""
    seen = watched(app, 0.5)

    enqueue(app, 30)
    settings = WorkerSettings(batch=BATCH, claim_hold=None, until_idle=True)
    w = Worker(app.engine, app.queue, app.handlers, settings=settings)
    assert not w.claim_ahead
    assert w.run() == 0

    assert seen == [BATCH]


def test_a_batch_claimed_ahead_goes_back_unspent_at_shutdown(app: App) -> None:
    w: list[Worker] = []

    @app.handler("watch", transactional=False)
    def watch(job: Job) -> None:
        if job.payload["i"] == 0:
            watch_running(app, 2 * BATCH, 2.0)
            w[0].stop()

    enqueue(app, 30)
    w.append(worker(app, until_idle=False))
    assert w[0].run() == 0

    found = states(app)
    assert found.pop("j0") == (JobState.COMPLETED, 1)
    assert set(found.values()) == {(JobState.AVAILABLE, 0)}, found
    assert running(app) == 0


def test_a_batch_claimed_ahead_whose_queue_came_to_rest_goes_back(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    rest_until: list[float] = []

    def gates() -> Gates:
        return Gates(resting={"default": rest_until[0]} if rest_until else {})

    @app.handler("watch", transactional=False)
    def watch(job: Job) -> None:
        if job.payload["i"] == 0:
            watch_running(app, 2 * BATCH, 2.0)
            rest_until.append(time.monotonic() + 0.3)  # the queue rests from now

    enqueue(app, 30)
    caplog.set_level(logging.INFO, logger="expiry.worker")
    assert worker(app, Hooks(gates=gates)).run() == 0

    released = [r for r in caplog.records if r.getMessage() == "job released its queue rests"]
    assert len(released) == (BATCH if app.engine.concurrent_writers else 0)
    # They ran after the rest, on their first attempt: the release spent none.
    assert states(app) == {f"j{i}": (JobState.COMPLETED, 1) for i in range(30)}


def test_a_paced_queue_is_never_claimed_ahead(app: App) -> None:
    seen = watched(app, 0.5)

    enqueue(app, 30)
    assert worker(app, Hooks(gates=lambda: Gates(limits={"default": BATCH}))).run() == 0

    assert seen == [BATCH]
