"""A worker loop claims about ``claim_hold`` seconds of work at a time: slow jobs
a few to a claim (the others stay free for idle workers), fast ones a full batch."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from expiry.app import App
from expiry.engines import open_engine
from expiry.queue.jobs import Queue, new_job
from expiry.queue.runner import Hooks, WorkerSettings
from expiry.queue.worker import Worker
from expiry.types import Gates, Job


def record_claims(app: App) -> list[int]:
    """The size of every non-empty claim the app's queue hands out from now on
    (counted at the claim itself: claims within one tick of SQLite's clock share
    their attempted_at)."""
    sizes: list[int] = []
    claim = app.queue.claim

    def counting(*args: Any, **kwargs: Any) -> list[Job]:
        jobs = claim(*args, **kwargs)
        if jobs:
            sizes.append(len(jobs))
        return jobs

    app.queue.claim = counting  # type: ignore[method-assign]
    return sizes


def test_slow_jobs_are_claimed_a_few_at_a_time(app: App) -> None:
    @app.handler("slow")
    def slow(job: Job, tx: Any) -> None:
        time.sleep(0.1)

    keys = [f"s{i}" for i in range(10)]
    app.queue.enqueue_many(new_job("slow", {}, None, key) for key in keys)
    sizes = record_claims(app)
    worker = app.worker(batch=16, claim_hold=0.25, until_idle=True, rng=random.Random(0))
    assert worker.run() == 0

    assert sum(sizes) == 10
    assert sizes[0] == 1  # nothing timed yet
    assert max(sizes) <= 3, sizes  # ~0.25 s of 0.1 s jobs, never the batch of 16


def test_fast_jobs_are_claimed_a_full_batch_at_a_time(app: App) -> None:
    app.handler("fast")(lambda job, tx: None)
    keys = [f"f{i}" for i in range(200)]
    app.queue.enqueue_many(new_job("fast", {}, None, key) for key in keys)
    sizes = record_claims(app)
    worker = app.worker(batch=16, claim_hold=0.25, until_idle=True, rng=random.Random(0))
    assert worker.run() == 0

    assert sum(sizes) == 200 and max(sizes) == 16, sizes


def test_the_end_of_a_backlog_is_claimed_in_halves(app: App) -> None:
    """Fair share: a loop takes at most half of what is due, so the last jobs of a
    backlog would spread over the workers instead of waiting in one worker's batch."""
    app.handler("fast")(lambda job, tx: None)
    app.queue.enqueue_many(new_job("fast", {}, None, f"f{i:02}") for i in range(40))
    sizes = record_claims(app)
    worker = app.worker(batch=16, claim_hold=10.0, until_idle=True, rng=random.Random(0))
    assert worker.run() == 0

    # One until timed; then 16 of 39 due, 12 of 23, 6 of 11, 3 of 5, 1 of 2, 1 of 1.
    assert sizes == [1, 16, 12, 6, 3, 1, 1]


def test_a_fixed_batch_worker_claims_whole_batches_to_the_end(app: App) -> None:
    app.handler("fast")(lambda job, tx: None)
    app.queue.enqueue_many(new_job("fast", {}, None, f"f{i:02}") for i in range(40))
    sizes = record_claims(app)
    worker = app.worker(batch=16, claim_hold=None, until_idle=True, rng=random.Random(0))
    assert worker.run() == 0

    assert sizes == [16, 16, 8]


def test_a_resting_queue_does_not_cost_an_empty_claim_of_the_others_each_job(
    app: App, db_url: str
) -> None:
    """Queue "a" rests 50 ms after each job (as a paced policy does), queue "b" is
    empty. On PostgreSQL, once a claim found "b" empty, the loop does not claim it
    again until a hint or a poll (5 s here), yet a job enqueued in "b" meanwhile by
    another process (its hint) is claimed at once. SQLite has no hints and claims
    as before."""
    done: dict[str, float] = {}
    resting: dict[str, float] = {}

    @app.handler("job")
    def job(j: Job, tx: Any) -> None:
        done[j.key] = time.monotonic()
        if j.queue == "a":
            resting["a"] = time.monotonic() + 0.05

    app.queue.enqueue_many(new_job("job", {}, None, f"a{i}", queue="a") for i in range(20))
    claims: list[tuple[tuple[str, ...], int]] = []
    claim = app.queue.claim

    def counting(*args: Any, **kwargs: Any) -> list[Job]:
        jobs = claim(*args, **kwargs)
        claims.append((tuple(kwargs["queues"]), len(jobs)))
        return jobs

    app.queue.claim = counting  # type: ignore[method-assign]
    hooks = Hooks(gates=lambda: Gates(resting=dict(resting), limits={"a": 1}))
    worker = Worker(
        app.engine,
        app.queue,
        app.handlers,
        hooks,
        WorkerSettings(queues=("a", "b"), poll=5.0, rescue_every=60.0),
        rng=random.Random(0),
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(done) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        other = open_engine(db_url)
        sent = time.monotonic()
        Queue(other).enqueue("job", {}, None, "b0", queue="b")
        other.close()
        while len(done) < 21 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.stop()
        thread.join(10)
    assert len(done) == 21, sorted(done)
    empty_b = sum(1 for queues, n in claims if queues == ("b",) and n == 0)
    if app.engine.hints_seen() is None:  # SQLite: polls, an empty claim each rest
        assert empty_b >= 15, claims
    else:
        assert empty_b <= 3, claims
        assert done["b0"] - sent < 1.0  # the hint, not the 5 s poll
