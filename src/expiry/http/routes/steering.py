"""The dashboard's state-changing routes: redrive and discard one dead job or
every one matching a filter (after a page that says how many), pause and
resume policies and cron targets. Each POST needs the session's CSRF token and
is audited under the signed-in key's name (``dashboard:NAME``)."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...app import App
from ...errors import ExpiryError
from ...types import JobState
from .. import views as v
from ..deps import DashboardPages, ExpiryApp
from ..render import Form
from ..sessions import Session

router = APIRouter(include_in_schema=False)


@router.post("/dlq/redrive")
def redrive(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form)
    if not isinstance(guarded, Session):
        return guarded
    keys = [form["key"]] if form.get("key") else []
    done = app.queue.redrive(keys, actor=f"dashboard:{guarded.key_name}")
    message = f"Redrove {v.plural(len(done))}." if done else "Nothing to redrive: not dead."
    return pages.done(request, form.get("next"), message)


@router.post("/dlq/discard")
def discard(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form)
    if not isinstance(guarded, Session):
        return guarded
    keys = [form["key"]] if form.get("key") else []
    done = app.queue.discard(keys, actor=f"dashboard:{guarded.key_name}")
    message = f"Discarded {v.plural(len(done))}." if done else "Nothing to discard."
    return pages.done(request, form.get("next"), message)


def matching(app: App, queue: str, policy: str) -> tuple[list[str], bool]:
    """The keys of the dead jobs a bulk action would touch; True if the scan was cut."""
    jobs, truncated = v.find_jobs(app, JobState.DEAD, queue=queue or None, policy=policy or None)
    return [j.key for j in jobs], truncated


@router.get("/dlq/bulk")
def bulk_confirm(
    request: Request,
    app: ExpiryApp,
    pages: DashboardPages,
    action: str = "redrive",
    queue: str = "",
    policy: str = "",
) -> Response:
    session = pages.session(request)
    if session is None:
        return pages.to_login(request)
    keys, truncated = matching(app, queue, policy)
    return pages.render(
        request,
        "bulk.html",
        session,
        action="discard" if action == "discard" else "redrive",
        queue=queue,
        policy=policy,
        count=len(keys),
        truncated=truncated,
        sample=keys[:10],
    )


@router.post("/dlq/bulk")
def bulk(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form)
    if not isinstance(guarded, Session):
        return guarded
    action = "discard" if form.get("action") == "discard" else "redrive"
    queue, policy = form.get("queue", ""), form.get("policy", "")
    keys, truncated = matching(app, queue, policy)
    if str(len(keys)) != form.get("expected"):
        return pages.render(
            request,
            "bulk.html",
            guarded,
            status=409,
            action=action,
            queue=queue,
            policy=policy,
            count=len(keys),
            truncated=truncated,
            sample=keys[:10],
            changed=form.get("expected"),
        )
    actor = f"dashboard:{guarded.key_name}"
    if action == "redrive":
        message = f"Redrove {v.plural(len(app.queue.redrive(keys, actor=actor)))}."
    else:
        message = f"Discarded {v.plural(len(app.queue.discard(keys, actor=actor)))}."
    target = "/dlq?" + urlencode({k: x for k, x in (("queue", queue), ("policy", policy)) if x})
    return pages.done(request, target.rstrip("?"), message)


@router.post("/policies/pause")
def pause_policy(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form)
    if not isinstance(guarded, Session):
        return guarded
    name, paused = form.get("policy", ""), form.get("paused") == "1"
    if app.cleanup is None:
        return pages.done(request, form.get("next"), "Not changed: this server has no policies.")
    try:
        app.scheduler().set_paused(name, paused, actor=f"dashboard:{guarded.key_name}")
    except ExpiryError as exc:
        return pages.done(request, form.get("next"), f"Not changed: {exc}")
    return pages.done(
        request, form.get("next"), f"{'Paused' if paused else 'Resumed'} policy {name}."
    )


@router.post("/crons/call")
def call_cron(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form)
    if not isinstance(guarded, Session):
        return guarded
    name = form.get("name", "")
    now = app.engine.now()
    if not app.crons.call_now(name, now, actor=f"dashboard:{guarded.key_name}"):
        return pages.done(request, "/crons", f"No cron target named {name}.")
    return pages.done(request, "/crons", f"Queued a call of cron target {name}.")


@router.post("/crons/pause")
def pause_cron(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form)
    if not isinstance(guarded, Session):
        return guarded
    name, paused = form.get("name", ""), form.get("paused") == "1"
    if not app.crons.set_paused(name, paused, actor=f"dashboard:{guarded.key_name}"):
        return pages.done(request, "/crons", f"No cron target named {name}.")
    return pages.done(request, "/crons", f"{'Paused' if paused else 'Resumed'} cron target {name}.")
