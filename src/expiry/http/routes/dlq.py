"""The dead-letter queue over HTTP: review dead jobs, redrive them with a fresh
attempt budget, or discard them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from .. import models as m
from ..deps import ExpiryApp, Key

router = APIRouter(prefix="/v1/dlq", tags=["dlq"])

# Query text reaches SQL parameters: constrain it like the bodies.
QueueFilter = Annotated[str | None, Query(pattern=m.QUEUE_NAME)]


@router.get("", response_model=list[m.DeadJob])
def dlq(_: Key, app: ExpiryApp, queue: QueueFilter = None, limit: int = 100) -> list[m.DeadJob]:
    return [
        m.DeadJob(
            key=j.key,
            queue=j.queue,
            handler=j.handler,
            attempt=j.attempt,
            error=j.last_error,
            kind=j.last_error_kind,
            payload=j.payload,
            errors=j.errors,
        )
        for j in app.queue.dead(queue, max(1, min(limit, 1000)))
    ]


@router.post("/redrive", response_model=m.Keys)
def redrive(body: m.RedriveRequest, name: Key, app: ExpiryApp) -> m.Keys:
    return m.Keys(
        keys=app.queue.redrive(body.keys, all=body.all, policy=body.policy, actor=f"api:{name}")
    )


@router.post("/discard", response_model=m.Keys)
def discard(body: m.DiscardRequest, name: Key, app: ExpiryApp) -> m.Keys:
    return m.Keys(keys=app.queue.discard(body.keys, actor=f"api:{name}"))
