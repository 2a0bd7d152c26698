"""The queue over HTTP: publish (one or a batch), and receive, ack, nack and
heartbeat for pull consumers. A received job comes with a receipt,
``id.attempt.lease_token``, that names its lease: an expired one gets 409 and
changes nothing."""

from __future__ import annotations

from fastapi import APIRouter

from ...errors import LeaseLost
from ...queue import new_job
from ...types import Job, JobState
from .. import models as m
from ..deps import ExpiryApp, Key
from ..errors import CONFLICT, TOO_LARGE, ApiError

router = APIRouter(prefix="/v1/queue", tags=["queue"])


def receipt(job: Job) -> str:
    return f"{job.id}.{job.attempt}.{job.lease_token}"


def job_from_receipt(text: str) -> Job:
    """The leased job a receipt names (its id, attempt and lease token; the rest blank)."""
    try:
        job_id, attempt, token = text.split(".", 2)
        return Job(
            id=int(job_id),
            queue="",
            handler="",
            key="",
            payload={},
            state=JobState.RUNNING,
            priority=0,
            attempt=int(attempt),
            max_attempts=0,
            run_at=None,  # type: ignore[arg-type]
            lease_token=token,
        )
    except ValueError:
        raise ApiError(422, "invalid_receipt", "receipt is not one this server issued") from None


def receipt_expired(message: str) -> ApiError:
    return ApiError(409, "receipt_expired", message)


@router.post("/publish", response_model=m.Published, responses=TOO_LARGE)
def publish(body: m.PublishRequest, _: Key, app: ExpiryApp) -> m.Published:
    job = new_job(
        body.queue,
        body.message,
        body.run_at or body.delay_seconds,
        body.key,
        queue=body.queue,
        priority=body.priority,
        max_attempts=body.max_attempts,
    )
    [result] = app.queue.enqueue_many([job])
    return m.Published(key=result.key, queue=body.queue, enqueued=result.enqueued)


@router.post("/publish_batch", response_model=m.PublishedBatch, responses=TOO_LARGE)
def publish_batch(body: m.PublishBatchRequest, _: Key, app: ExpiryApp) -> m.PublishedBatch:
    jobs = [
        new_job(
            body.queue,
            message,
            body.delay_seconds,
            body.keys[i] if body.keys else None,
            queue=body.queue,
        )
        for i, message in enumerate(body.messages)
    ]
    results = app.queue.enqueue_many(jobs)
    shaped = [m.Published(key=r.key, queue=body.queue, enqueued=r.enqueued) for r in results]
    fresh = sum(r.enqueued for r in results)
    return m.PublishedBatch(results=shaped, enqueued=fresh, duplicates=len(results) - fresh)


@router.post("/receive", response_model=m.Received)
def receive(body: m.ReceiveRequest, name: Key, app: ExpiryApp) -> m.Received:
    jobs = app.queue.claim(body.max, body.lease_seconds, queues=(body.queue,), owner=f"http:{name}")
    return m.Received(
        jobs=[
            m.ReceivedJob(
                receipt=receipt(j),
                key=j.key,
                queue=j.queue,
                message=j.payload,
                attempt=j.attempt,
                max_attempts=j.max_attempts,
                lease_expires_at=j.lease_expires_at,
            )
            for j in jobs
        ]
    )


@router.post("/ack", response_model=m.JobOutcome, responses=CONFLICT)
def ack(body: m.AckRequest, _: Key, app: ExpiryApp) -> m.JobOutcome:
    job = job_from_receipt(body.receipt)
    try:
        app.queue.complete(job)
    except LeaseLost:
        raise receipt_expired(
            "the lease behind this receipt expired or moved to "
            "another consumer; the job was not acknowledged"
        ) from None
    return m.JobOutcome(key=str(job.id), state="completed")


@router.post("/nack", response_model=m.JobOutcome, responses=CONFLICT)
def nack(body: m.NackRequest, _: Key, app: ExpiryApp) -> m.JobOutcome:
    job = job_from_receipt(body.receipt)
    error = body.error or "nacked by consumer"
    if body.permanent:
        state = app.engine.job_fail(job, error, "nack_permanent", None)
    elif body.delay_seconds is not None:
        state = app.engine.job_fail(job, error, "nack", body.delay_seconds)
    else:
        state = app.queue.fail(job, error, transient=True, kind="nack")
    if state is None:
        raise receipt_expired("the lease behind this receipt expired; nothing changed")
    return m.JobOutcome(key=str(job.id), state=state.value)


@router.post("/heartbeat", response_model=m.JobOutcome, responses=CONFLICT)
def heartbeat(body: m.HeartbeatRequest, _: Key, app: ExpiryApp) -> m.JobOutcome:
    job = job_from_receipt(body.receipt)
    if not app.queue.heartbeat(job, body.lease_seconds):
        raise receipt_expired("the lease behind this receipt expired; stop working on it")
    return m.JobOutcome(key=str(job.id), state="running")
