"""A claim on PostgreSQL skips due jobs whose rows another transaction has locked
(FOR UPDATE SKIP LOCKED): it takes the next due job at once instead of waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from expiry.engines import Engine, open_engine
from expiry.queue.jobs import Queue
from expiry.types import Job

WAIT_SECONDS = 3.0
"""A claim takes milliseconds; one still waiting after this is blocked."""


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    eng = open_engine(pg_url)
    yield eng
    eng.close()


def test_a_claim_skips_a_due_job_locked_by_another_transaction(
    pg_url: str, pg_engine: Engine
) -> None:
    queue = Queue(pg_engine)
    queue.enqueue("noop", {}, None, "locked", priority=0)  # first in claim order
    queue.enqueue("noop", {}, None, "free", priority=1)
    claimed: list[list[Job]] = []

    with psycopg.connect(pg_url) as locker:  # a transaction left open on the first job
        locker.execute("select id from expiry.jobs where key = 'locked' for update")
        thread = threading.Thread(target=lambda: claimed.append(queue.claim(1, owner="w")))
        started = time.monotonic()
        thread.start()
        thread.join(WAIT_SECONDS)
        waited = time.monotonic() - started
        locker.rollback()  # a claim that did block returns now: the test fails, not hangs
    thread.join(30)

    assert waited < WAIT_SECONDS, "the claim waited for the locked job"
    [jobs] = claimed
    assert [job.key for job in jobs] == ["free"]
    # Once the lock is gone the skipped job is claimable again.
    assert [job.key for job in queue.claim(1, owner="w")] == ["locked"]
