"""The handler model: ``@app.handler(name)`` runs in the job's transaction;
``transactional=False`` runs ``fn(job)`` outside any transaction and the worker
completes the job afterwards, or records its failure; the private modes are
not offered by the decorator."""

from __future__ import annotations

import random
from typing import Any

import pytest
from _support import make_due

from expiry.app import App
from expiry.errors import TransientError
from expiry.types import Job, JobState


def drain(app: App) -> None:
    worker = app.worker(until_idle=True, poll=0.05, rescue_every=3600, rng=random.Random(0))
    assert worker.run() == 0


def test_a_handler_without_a_transaction_gets_only_the_job_and_its_job_completes(
    app: App,
) -> None:
    seen: list[tuple[str, int]] = []

    @app.handler("purge", transactional=False)
    def purge(*args: Any) -> str:
        (job,) = args  # no tx: called with the job alone
        seen.append((job.key, job.attempt))
        return "purged"

    app.queue.enqueue("purge", {"url": "/a"}, key="purge:a")
    drain(app)
    assert seen == [("purge:a", 1)]
    done = app.queue.get("purge:a")
    assert done is not None and done.state is JobState.COMPLETED


def test_a_failing_handler_without_a_transaction_retries_then_completes(app: App) -> None:
    attempts: list[int] = []

    @app.handler("flaky", transactional=False)
    def flaky(job: Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 1:
            raise TransientError("the CDN answered 503")

    app.queue.enqueue("flaky", {}, key="flaky:1")
    drain(app)
    failed = app.queue.get("flaky:1")
    assert failed is not None and failed.state is JobState.RETRYABLE
    assert failed.last_error is not None and "503" in failed.last_error
    make_due(app.engine, ["flaky:1"])  # the retry waits out its backoff: due now
    drain(app)
    assert attempts == [1, 2]
    done = app.queue.get("flaky:1")
    assert done is not None and done.state is JobState.COMPLETED


def test_the_decorator_offers_no_private_mode(app: App) -> None:
    with pytest.raises(TypeError):
        app.handler("fast", statement=True, completes_job=True)  # type: ignore[call-arg]
