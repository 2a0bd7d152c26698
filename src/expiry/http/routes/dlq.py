"""The dead-letter queue over HTTP: review dead jobs, redrive them with a fresh
attempt budget, or discard them. A key with dlq:manage (or admin) works the
whole dead-letter queue, expiry's own dead windows too; a key with
queue:consume scopes works the dead jobs of the queues it consumes, and
never names one of expiry's own (403)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ...keys import Principal
from ...queue.jobs import dedupe_key, message_key
from ...types import Job
from .. import models as m
from ..deps import ExpiryApp, Key, forbidden

router = APIRouter(prefix="/v1/dlq", tags=["dlq"])

# Query text reaches SQL parameters: constrain it like the bodies.
QueueFilter = Annotated[str | None, Query(pattern=m.QUEUE_NAME)]


def mine(key: Principal, job: Job) -> bool:
    """A dead job the key may review, redrive and discard."""
    return key.can("dlq:manage") or key.can_queue("consume", job.queue)


def dead_job(job: Job) -> m.DeadJob | None:
    """The job as the API shows it; None when it cannot be shown (a payload
    stored before messages were bounded): listed without it, not a 500."""
    fields = {
        "key": dedupe_key(job.key, job.queue),
        "queue": job.queue,
        "handler": job.handler,
        "attempt": job.attempt,
        "error": job.last_error,
        "kind": job.last_error_kind,
        "errors": job.errors,
    }
    try:
        shown = m.DeadJob(payload=job.payload, **fields)
        shown.model_dump_json()
    except (ValueError, RecursionError):
        return m.DeadJob(payload={"unreadable": "nested too deep to show"}, **fields)
    return shown


@router.get("", response_model=list[m.DeadJob])
def dlq(key: Key, app: ExpiryApp, queue: QueueFilter = None, limit: int = 100) -> list[m.DeadJob]:
    if queue is not None and not (key.can("dlq:manage") or key.can_queue("consume", queue)):
        raise forbidden(
            key, "dlq:manage" if queue.startswith("expiry.") else f"queue:consume:{queue}"
        )
    found = app.queue.dead(queue, max(1, min(limit, 1000)))
    return [shown for j in found if mine(key, j) and (shown := dead_job(j)) is not None]


def named_jobs(
    app: ExpiryApp, key: Principal, names: list[str], queue: str | None, states: tuple[str, ...]
) -> dict[str, str]:
    """The jobs ``names`` stand for, as job key -> the name as given. A name is a
    job key, or a message's dedupe key (as published, as /v1/dlq lists it) in
    ``queue``, or, without one, in any queue holding jobs in ``states``. A job
    on a queue the key may not consume is left out as one that is not there
    is: the answer (the names acted on) tells nothing of other queues' jobs."""
    if queue is not None:
        queues = [queue]
    else:
        by_state = app.queue.stats().by_state
        queues = sorted(q for q, n in by_state.items() if any(n.get(s) for s in states))
    wanted: dict[str, str] = {}
    for name in names:
        for q in queues:
            wanted.setdefault(message_key(q, name), name)
        if queue is None:
            wanted.setdefault(name, name)
    if key.can("dlq:manage"):
        return wanted
    return {
        job_key: name
        for job_key, name in wanted.items()
        if (job := app.queue.get(job_key)) is not None and mine(key, job)
    }


@router.post("/redrive", response_model=m.Keys)
def redrive(body: m.RedriveRequest, key: Key, app: ExpiryApp) -> m.Keys:
    if (body.all or body.policy) and not key.can("dlq:manage"):
        raise forbidden(key, "dlq:manage")
    named = named_jobs(app, key, body.keys, body.queue, ("dead",))
    done = app.queue.redrive(list(named), all=body.all, policy=body.policy, actor=f"api:{key.name}")
    return m.Keys(keys=list(dict.fromkeys(named.get(k, k) for k in done)))


@router.post("/discard", response_model=m.Keys)
def discard(body: m.DiscardRequest, key: Key, app: ExpiryApp) -> m.Keys:
    waiting = ("dead", "scheduled", "available", "retryable")
    named = named_jobs(app, key, body.keys, body.queue, waiting)
    done = app.queue.discard(list(named), actor=f"api:{key.name}")
    return m.Keys(keys=list(dict.fromkeys(named[k] for k in done)))
