"""Retry delays: capped exponential backoff with full jitter. The delay after a
failed attempt is drawn from [0, min(600 s, 2**attempt s)], so that jobs failing
together do not retry together, and no retry waits more than ten minutes."""

from __future__ import annotations

import random
from typing import Any

from _support import execute, make_due

from expiry import defaults
from expiry.engines import Engine
from expiry.queue import retry
from expiry.queue.jobs import Queue
from expiry.types import JobState

CAP = 600.0
"""Ten minutes: the published cap (docs, defaults.BACKOFF_CAP_SECONDS)."""

DELAY = {
    "postgres": "extract(epoch from run_at - updated_at)::float8",
    "sqlite": "run_at - updated_at",
    "mysql": "timestampdiff(microsecond, updated_at, run_at) / 1e6",
}
"""The delay a failure drew: job_fail sets run_at to now() + delay, updated_at to now()."""


def test_the_cap_is_ten_minutes() -> None:
    assert defaults.BACKOFF_CAP_SECONDS == CAP


def test_delays_for_the_same_attempt_spread_over_zero_to_the_ceiling() -> None:
    rng = random.Random(7)
    for attempt, ceiling in ((1, 2.0), (4, 16.0), (20, CAP)):
        draws = [retry.backoff(attempt, rng) for _ in range(500)]
        assert all(0.0 <= d <= ceiling for d in draws), attempt
        assert len(set(draws)) > 450, attempt  # jitter: not one fixed delay
        # Full jitter: the draws reach down near zero and up near the ceiling.
        assert min(draws) < ceiling * 0.05 and max(draws) > ceiling * 0.95, attempt
        assert 0.4 * ceiling < sum(draws) / len(draws) < 0.6 * ceiling, attempt


def test_the_same_seed_draws_the_same_delays() -> None:
    first = [retry.backoff(3, random.Random(42)) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    rng = random.Random(42)
    assert [retry.backoff(3, rng) for _ in range(5)] != [first[0]] * 5


def test_no_delay_exceeds_the_cap() -> None:
    rng = random.Random(3)
    for attempt in range(1, 200):
        assert retry.ceiling(attempt) == min(CAP, 2.0**attempt)
        assert 0.0 <= retry.backoff(attempt, rng) <= CAP
    assert max(retry.backoff(62, rng) for _ in range(1000)) <= CAP
    assert retry.schedule(40)[-1] == (39, CAP)
    assert all(wait <= CAP for _, wait in retry.schedule(100))


def delays(engine: Engine) -> dict[str, float]:
    rows = execute(engine, f"select key, {DELAY[engine.dialect]} as delay from expiry.jobs")
    return {row["key"]: float(row["delay"]) for row in rows}


def fail_all(queue: Queue, n: int) -> list[Any]:
    jobs = queue.claim(n, owner="w")
    assert len(jobs) == n
    return [queue.fail(job, "boom") for job in jobs]


def test_jobs_failing_together_retry_at_different_times(queue: Queue, engine: Engine) -> None:
    for i in range(20):
        queue.enqueue("noop", {}, None, f"j{i}")
    assert fail_all(queue, 20) == [JobState.RETRYABLE] * 20  # attempt 1: up to 2 s

    drawn = delays(engine)
    assert all(0.0 <= d <= 2.0 + 1e-3 for d in drawn.values()), drawn
    assert len({round(d, 3) for d in drawn.values()}) > 15, drawn
    assert max(drawn.values()) - min(drawn.values()) > 0.5, drawn


def test_a_late_attempt_retries_within_the_cap(queue: Queue, engine: Engine) -> None:
    for i in range(10):
        queue.enqueue("noop", {}, None, f"j{i}", max_attempts=100)
    execute(engine, "update expiry.jobs set attempt = 40")
    make_due(engine)
    assert fail_all(queue, 10) == [JobState.RETRYABLE] * 10  # attempt 41: 2**41 s uncapped

    drawn = delays(engine)
    assert all(0.0 <= d <= CAP + 1e-3 for d in drawn.values()), drawn
    assert len({round(d, 3) for d in drawn.values()}) > 5, drawn
