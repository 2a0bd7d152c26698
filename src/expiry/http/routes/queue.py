"""The queue over HTTP: publish (one or a batch), and receive, ack (one or a
batch), nack and heartbeat for pull consumers. A received job comes with a receipt,
``id.attempt.lease_token``, that names its lease: an expired one gets 409 and
changes nothing. A receipt is a capability: its token is unguessable,
issued only to a consumer that may receive from the job's queue, and bound
to that queue (a consumer of another queue cannot use it). Publishing
needs queue:publish for the queue, the others queue:consume; expiry's own
queues are never named here (422)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter

from ... import defaults
from ...errors import LeaseLost
from ...keys import Principal
from ...queue.jobs import dedupe_key, message_key, new_job
from ...types import Job, JobState, NewJob
from .. import models as m
from ..deps import ExpiryApp, Key, PublishQuotas, forbidden
from ..errors import CONFLICT, QUOTA, TOO_LARGE, ApiError

log = logging.getLogger("expiry.http")

MAX_ID = 2**63 - 1

router = APIRouter(prefix="/v1/queue", tags=["queue"])


def receipt(job: Job) -> str:
    return f"{job.id}.{job.attempt}.{job.lease_token}"


def job_from_receipt(text: str) -> Job:
    """The leased job a receipt names (its id, attempt and lease token; the rest blank)."""
    try:
        job_id, attempt, token = text.split(".", 2)
        if not (0 < int(job_id) <= MAX_ID and 0 < int(attempt) < 2**31):
            raise ValueError("out of range")
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


def may(key: Principal, verb: str, queue: str) -> None:
    """403 unless the key may ``verb`` (publish, consume) on ``queue``."""
    if not key.can_queue(verb, queue):
        raise forbidden(key, f"queue:{verb}:{queue}")


def consumer(key: Principal) -> None:
    """403 for a key that consumes no queue (a receipt's holder must be one)."""
    if not (key.admin or any(s.startswith("queue:consume:") for s in key.scopes)):
        raise forbidden(key, "queue:consume:PATTERN")


def bound(key: Principal, app: ExpiryApp, jobs: list[Job]) -> set[int]:
    """The ids of the receipts' jobs on queues the key consumes. A receipt is
    bound to its queue: one that reached a consumer of another queue changes
    nothing there, and is answered as an expired one (telling nothing)."""
    if key.admin:
        return {job.id for job in jobs}
    queues = app.queue.queues_of(jobs)
    return {j.id for j in jobs if (q := queues.get(j.id)) and key.can_queue("consume", q)}


def leased(key: Principal, app: ExpiryApp, text: str) -> Job:
    """The job a receipt names, for a consumer of its queue; 409 otherwise."""
    job = job_from_receipt(text)
    if not bound(key, app, [job]):
        raise receipt_expired(
            "the lease behind this receipt expired, or it is not on a queue this key "
            "consumes; nothing changed"
        )
    return job


@router.post("/publish", response_model=m.Published, responses={**TOO_LARGE, **QUOTA})
def publish(body: m.PublishRequest, key: Key, app: ExpiryApp, quotas: PublishQuotas) -> m.Published:
    """Enqueue one message; a key a message of this queue holds already is a
    duplicate (``enqueued: false``). Dedupe keys are each queue's own
    (message_key): another queue's keys neither block nor show."""
    may(key, "publish", body.queue)
    quotas.admit(key, body.queue, [body.message])
    [result] = app.queue.enqueue_many([message(body.queue, body.message, body.key, body)])
    return m.Published(
        key=dedupe_key(result.key, body.queue), queue=body.queue, enqueued=result.enqueued
    )


@router.post("/publish_batch", response_model=m.PublishedBatch, responses={**TOO_LARGE, **QUOTA})
def publish_batch(
    body: m.PublishBatchRequest, key: Key, app: ExpiryApp, quotas: PublishQuotas
) -> m.PublishedBatch:
    may(key, "publish", body.queue)
    quotas.admit(key, body.queue, body.messages)
    jobs = [
        message(body.queue, payload, body.keys[i] if body.keys else None, body)
        for i, payload in enumerate(body.messages)
    ]
    results = app.queue.enqueue_many(jobs)
    fresh = sum(r.enqueued for r in results)
    return m.PublishedBatch(
        results=[
            m.Published(key=dedupe_key(r.key, body.queue), queue=body.queue, enqueued=r.enqueued)
            for r in results
        ],
        enqueued=fresh,
        duplicates=len(results) - fresh,
    )


def message(
    queue: str,
    payload: dict[str, Any],
    key: str | None,
    body: m.PublishRequest | m.PublishBatchRequest,
) -> NewJob:
    """A published message as a job: its job key is the queue's own (message_key)."""
    one = body if isinstance(body, m.PublishRequest) else None
    return new_job(
        queue,
        payload,
        (one.run_at or one.delay_seconds) if one else body.delay_seconds,
        message_key(queue, key) if key is not None else None,
        queue=queue,
        priority=one.priority if one else 0,
        max_attempts=one.max_attempts if one else defaults.MAX_ATTEMPTS,
    )


@router.post("/receive", response_model=m.Received)
def receive(body: m.ReceiveRequest, key: Key, app: ExpiryApp) -> m.Received:
    may(key, "consume", body.queue)
    jobs = app.queue.claim(
        body.max, body.lease_seconds, queues=(body.queue,), owner=f"http:{key.name}"
    )
    return m.Received(jobs=[shown for j in jobs if (shown := deliverable(app, j)) is not None])


def deliverable(app: ExpiryApp, job: Job) -> m.ReceivedJob | None:
    """The job as a consumer receives it; a message that cannot be sent (stored
    before messages were bounded) goes to the dead-letter queue alone, with
    the reason, and the rest of the batch is delivered."""
    try:
        shown = m.ReceivedJob(
            receipt=receipt(job),
            key=dedupe_key(job.key, job.queue),
            queue=job.queue,
            message=job.payload,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            lease_expires_at=job.lease_expires_at,
        )
        shown.model_dump_json()
    except (ValueError, RecursionError) as exc:
        reason = f"undeliverable: the message cannot be sent as JSON ({type(exc).__name__})"
        app.engine.job_fail(job, reason, "undeliverable", None)
        log.error("job dead-lettered: %s", reason, extra={"job": job.key, "queue": job.queue})
        return None
    return shown


@router.post("/ack", response_model=m.JobOutcome, responses=CONFLICT)
def ack(body: m.AckRequest, key: Key, app: ExpiryApp) -> m.JobOutcome:
    consumer(key)
    job = leased(key, app, body.receipt)
    try:
        app.queue.complete(job)
    except LeaseLost:
        raise receipt_expired(
            "the lease behind this receipt expired or moved to "
            "another consumer; the job was not acknowledged"
        ) from None
    return m.JobOutcome(key=str(job.id), state="completed")


@router.post("/ack_batch", response_model=m.AckedBatch)
def ack_batch(body: m.AckBatchRequest, key: Key, app: ExpiryApp) -> m.AckedBatch:
    """Acknowledge many received jobs in one transaction (a consumer that batches
    its acks pays one commit for them all). A receipt whose lease is gone is
    listed as expired, and the others are acknowledged all the same."""
    consumer(key)
    jobs = {text: job_from_receipt(text) for text in dict.fromkeys(body.receipts)}
    if len({job.id for job in jobs.values()}) < len(jobs):
        raise ApiError(
            422,
            "invalid_receipt",
            "two receipts name the same job: only the latest one received can hold its "
            "lease; send that one",
        )
    mine = bound(key, app, list(jobs.values()))
    done = {job.id for job in app.queue.ack_many([j for j in jobs.values() if j.id in mine])}
    return m.AckedBatch(
        acked=[text for text, job in jobs.items() if job.id in done],
        expired=[text for text, job in jobs.items() if job.id not in done],
    )


@router.post("/nack", response_model=m.JobOutcome, responses=CONFLICT)
def nack(body: m.NackRequest, key: Key, app: ExpiryApp) -> m.JobOutcome:
    consumer(key)
    job = leased(key, app, body.receipt)
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
def heartbeat(body: m.HeartbeatRequest, key: Key, app: ExpiryApp) -> m.JobOutcome:
    consumer(key)
    job = leased(key, app, body.receipt)
    if not app.queue.heartbeat(job, body.lease_seconds):
        raise receipt_expired("the lease behind this receipt expired; stop working on it")
    return m.JobOutcome(key=str(job.id), state="running")
