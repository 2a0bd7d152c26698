"""A worker loop claims about ``claim_hold`` seconds of work at a time: slow jobs
a few to a claim (the others stay free for idle workers), fast ones a full batch."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

from expiry.app import App
from expiry.queue import new_job
from expiry.types import Job
from expiry.worker import Worker


def claim_sizes(app: App, keys: list[str]) -> list[int]:
    """Jobs claimed together share their claim's database time (attempted_at)."""
    times: Counter[Any] = Counter()
    for key in keys:
        job = app.queue.get(key)
        assert job is not None and job.attempted_at is not None
        times[job.attempted_at] += 1
    return [times[t] for t in sorted(times)]


def test_slow_jobs_are_claimed_a_few_at_a_time(app: App) -> None:
    @app.handler("slow")
    def slow(job: Job, tx: Any) -> None:
        time.sleep(0.1)

    keys = [f"s{i}" for i in range(10)]
    app.queue.enqueue_many(new_job("slow", {}, None, key) for key in keys)
    worker = Worker(app, batch=16, claim_hold=0.25, until_idle=True, rng=random.Random(0))
    assert worker.run() == 0

    sizes = claim_sizes(app, keys)
    assert sum(sizes) == 10
    assert sizes[0] == 1  # nothing timed yet
    assert max(sizes) <= 3, sizes  # ~0.25 s of 0.1 s jobs, never the batch of 16


def test_fast_jobs_are_claimed_a_full_batch_at_a_time(app: App) -> None:
    app.handler("fast")(lambda job, tx: None)
    keys = [f"f{i}" for i in range(200)]
    app.queue.enqueue_many(new_job("fast", {}, None, key) for key in keys)
    worker = Worker(app, batch=16, claim_hold=0.25, until_idle=True, rng=random.Random(0))
    assert worker.run() == 0

    sizes = claim_sizes(app, keys)
    assert sum(sizes) == 200 and max(sizes) == 16, sizes
