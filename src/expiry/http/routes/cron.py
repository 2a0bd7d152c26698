"""Cron targets over HTTP: create one (its signing secret is shown once), list,
read, change (URL, schedule, time zone, call timeout), delete, pause and resume them, and read a target's call history. Every
route needs cron:manage; a target belongs to the key that created it, and
another key (not admin) gets 404 for it, as if it did not exist."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from ...cron.targets import Crons
from ...keys import Principal
from .. import models as m
from ..deps import CronManager, ExpiryApp
from ..errors import NOT_FOUND, ApiError

router = APIRouter(prefix="/v1/cron", tags=["cron"])

# Path text reaches SQL parameters: constrain it like the bodies.
CronName = Annotated[str, Path(pattern=m.CRON_NAME)]


def visible(target: dict[str, Any], key: Principal) -> bool:
    """A key sees its own targets; an admin key sees every one."""
    return key.admin or target["owner"] == key.name


def cron_or_404(crons: Crons, name: str, key: Principal) -> dict[str, Any]:
    found = crons.get(name)
    if found is None or not visible(found, key):
        raise ApiError(404, "not_found", f"no cron target named {name!r}")
    return found


@router.post("/create", response_model=m.CronCreated, status_code=201)
def cron_create(body: m.CronCreateRequest, key: CronManager, app: ExpiryApp) -> m.CronCreated:
    created = app.crons.create(
        body.name,
        body.http_url,
        body.schedule,
        body.timezone,
        actor=f"api:{key.name}",
        owner=key.name,
        timeout=body.timeout_seconds,
    )
    return m.CronCreated(**created)


@router.get("", response_model=list[m.CronTarget])
def cron_list(key: CronManager, app: ExpiryApp) -> list[m.CronTarget]:
    return [m.CronTarget(**t) for t in app.crons.targets() if visible(t, key)]


@router.get("/{name}", response_model=m.CronTarget, responses=NOT_FOUND)
def cron_get(name: CronName, key: CronManager, app: ExpiryApp) -> m.CronTarget:
    return m.CronTarget(**cron_or_404(app.crons, name, key))


@router.patch("/{name}", response_model=m.CronTarget, responses=NOT_FOUND)
def cron_update(
    name: CronName, body: m.CronUpdateRequest, key: CronManager, app: ExpiryApp
) -> m.CronTarget:
    """Point a target at another URL, schedule, time zone or call timeout, each
    checked as at create; its secret, owner and fires so far stay."""
    cron_or_404(app.crons, name, key)
    given = "timeout_seconds" in body.model_fields_set
    updated = app.crons.update(
        name,
        http_url=body.http_url,
        schedule=body.schedule,
        timezone=body.timezone,
        timeout=body.timeout_seconds if given else ...,
        actor=f"api:{key.name}",
    )
    if updated is None:  # deleted meanwhile
        raise ApiError(404, "not_found", f"no cron target named {name!r}")
    return m.CronTarget(**updated)


@router.delete("/{name}", response_model=m.Paused, responses=NOT_FOUND)
def cron_delete(name: CronName, key: CronManager, app: ExpiryApp) -> m.Paused:
    found = cron_or_404(app.crons, name, key)
    app.crons.delete(name, actor=f"api:{key.name}")
    return m.Paused(name=name, paused=found["paused"])


@router.post("/{name}/pause", response_model=m.Paused, responses=NOT_FOUND)
def cron_pause(name: CronName, key: CronManager, app: ExpiryApp) -> m.Paused:
    cron_or_404(app.crons, name, key)
    app.crons.set_paused(name, True, actor=f"api:{key.name}")
    return m.Paused(name=name, paused=True)


@router.post("/{name}/resume", response_model=m.Paused, responses=NOT_FOUND)
def cron_resume(name: CronName, key: CronManager, app: ExpiryApp) -> m.Paused:
    cron_or_404(app.crons, name, key)
    app.crons.set_paused(name, False, actor=f"api:{key.name}")
    return m.Paused(name=name, paused=False)


@router.get("/{name}/calls", response_model=list[m.CronCall], responses=NOT_FOUND)
def cron_calls(name: CronName, key: CronManager, app: ExpiryApp) -> list[m.CronCall]:
    cron_or_404(app.crons, name, key)
    return [m.CronCall(**c) for c in app.crons.calls(name)]
