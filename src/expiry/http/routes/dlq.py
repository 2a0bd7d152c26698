"""The dead-letter queue over HTTP: review dead jobs, redrive them with a fresh
attempt budget, or discard them. A key with dlq:manage (or admin) works the
whole dead-letter queue, expiry's own dead windows too; a key with
queue:consume scopes works the dead jobs of the queues it consumes, and
never names one of expiry's own (403)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ...keys import Principal
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
        "key": job.key,
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


def own_keys(app: ExpiryApp, key: Principal, keys: list[str]) -> list[str]:
    """The jobs named that the key may redrive or discard. A job on a queue it
    may not consume is left out as one that is not there is: the answer (the
    keys acted on) tells nothing of other queues' jobs."""
    if key.can("dlq:manage"):
        return keys
    return [name for name in keys if (job := app.queue.get(name)) is not None and mine(key, job)]


@router.post("/redrive", response_model=m.Keys)
def redrive(body: m.RedriveRequest, key: Key, app: ExpiryApp) -> m.Keys:
    if (body.all or body.policy) and not key.can("dlq:manage"):
        raise forbidden(key, "dlq:manage")
    named = own_keys(app, key, body.keys)
    return m.Keys(
        keys=app.queue.redrive(named, all=body.all, policy=body.policy, actor=f"api:{key.name}")
    )


@router.post("/discard", response_model=m.Keys)
def discard(body: m.DiscardRequest, key: Key, app: ExpiryApp) -> m.Keys:
    named = own_keys(app, key, body.keys)
    return m.Keys(keys=app.queue.discard(named, actor=f"api:{key.name}"))
