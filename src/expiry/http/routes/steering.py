"""The dashboard's state-changing routes: redrive and discard one dead job or
every one matching a filter (a queue, a policy, a run, one error's group;
after a page that says how many), trigger and cancel a run, pause and resume
policies and cron targets. Each POST needs the session's CSRF token and
is audited under the signed-in key's name (``dashboard:NAME``)."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...app import App
from ...errors import ConfigError, ExpiryError
from ...keys import Principal
from ...types import JobState
from .. import views as v
from ..deps import DashboardPages, ExpiryApp
from ..render import Form, Pages
from ..sessions import Session

router = APIRouter(include_in_schema=False)


@router.post("/dlq/redrive")
def redrive(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form, "dlq:manage")
    if not isinstance(guarded, Session):
        return guarded
    keys = [form["key"]] if form.get("key") else []
    done = app.queue.redrive(keys, actor=f"dashboard:{guarded.key_name}")
    message = f"Redrove {v.plural(len(done))}." if done else "Nothing to redrive: not dead."
    return pages.done(request, form.get("next"), message)


@router.post("/dlq/discard")
def discard(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form, "dlq:manage")
    if not isinstance(guarded, Session):
        return guarded
    keys = [form["key"]] if form.get("key") else []
    done = app.queue.discard(keys, actor=f"dashboard:{guarded.key_name}")
    message = f"Discarded {v.plural(len(done))}." if done else "Nothing to discard."
    return pages.done(request, form.get("next"), message)


BULK_FILTERS = ("queue", "policy", "run", "error")
"""What a bulk action on dead letters may be narrowed by (a group of one
error, the dead windows of one run)."""


def matching(app: App, who: Principal, filters: dict[str, str]) -> tuple[list[str], bool]:
    """The keys of the dead jobs a bulk action by ``who`` would touch; True if
    the scan was cut."""
    jobs, truncated = v.find_jobs(
        app,
        JobState.DEAD,
        who,
        queue=filters["queue"] or None,
        policy=filters["policy"] or None,
        run_id=filters["run"] or None,
        error=filters["error"] or None,
    )
    return [j.key for j in jobs], truncated


@router.get("/dlq/bulk")
def bulk_confirm(
    request: Request,
    app: ExpiryApp,
    pages: DashboardPages,
    action: str = "redrive",
    queue: str = "",
    policy: str = "",
    run: str = "",
    error: str = "",
) -> Response:
    session = pages.session(request)
    if session is None:
        return pages.to_login(request)
    filters = {"queue": queue, "policy": policy, "run": run, "error": error}
    keys, truncated = matching(app, session.principal, filters)
    return pages.render(
        request,
        "bulk.html",
        session,
        action="discard" if action == "discard" else "redrive",
        filters=filters,
        count=len(keys),
        truncated=truncated,
        sample=keys[:10],
    )


@router.post("/dlq/bulk")
def bulk(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form, "dlq:manage")
    if not isinstance(guarded, Session):
        return guarded
    action = "discard" if form.get("action") == "discard" else "redrive"
    filters = {name: form.get(name, "") for name in BULK_FILTERS}
    keys, truncated = matching(app, guarded.principal, filters)
    if str(len(keys)) != form.get("expected"):
        return pages.render(
            request,
            "bulk.html",
            guarded,
            status=409,
            action=action,
            filters=filters,
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
    kept = {k: x for k, x in filters.items() if x and k in ("queue", "policy", "run")}
    return pages.done(request, ("/dlq?" + urlencode(kept)).rstrip("?"), message)


@router.post("/runs/cancel")
def cancel_run(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form, "cleanup:trigger")
    if not isinstance(guarded, Session):
        return guarded
    run_id = form.get("run", "")
    target = "/runs/" + quote(run_id, safe="")
    try:
        done = app.runs.cancel(run_id, actor=f"dashboard:{guarded.key_name}")
    except ExpiryError as exc:
        return pages.done(request, target, f"Not cancelled: {exc}")
    return pages.done(
        request, target, f"Cancelled run {run_id}: {v.plural(done['jobs_cancelled'])} cancelled."
    )


@router.post("/runs/approve")
def approve_run(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form, "cleanup:approve")
    if not isinstance(guarded, Session):
        return guarded
    run_id = form.get("run", "")
    target = "/runs/" + quote(run_id, safe="")
    if app.cleanup is None:
        return pages.done(request, target, "Not approved: this server has no policies")
    try:
        app.cleanup.approve(run_id, actor=f"dashboard:{guarded.key_name}")
    except ExpiryError as exc:
        return pages.done(request, target, f"Not approved: {exc}")
    return pages.done(request, target, f"Approved run {run_id}: its windows are being planned.")


@router.post("/policies/pause")
def pause_policy(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form, "cleanup:trigger")
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


@router.post("/policies/trigger")
def trigger_policy(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    """Open a run of the policy now (cutoff: the database's now - retain), as
    `expiry trigger` does; to its run page."""
    guarded = pages.guard(request, form, "cleanup:trigger")
    if not isinstance(guarded, Session):
        return guarded
    name = form.get("policy", "")
    if app.cleanup is None or name not in {p.name for p in app.cleanup.policies}:
        return pages.done(request, "/", f"Not triggered: no policy {name!r}.")
    try:
        opened = app.cleanup.open_run(name, actor=f"dashboard:{guarded.key_name}")
    except ExpiryError as exc:
        return pages.done(request, "/", f"Not triggered: {exc}")
    said = "Opened run" if opened.created else "A run for this cutoff is open already:"
    return pages.done(request, "/runs/" + quote(opened.run_id, safe=""), f"{said} {opened.run_id}.")


def owns(app: App, session: Session, name: str) -> bool:
    """The session's key may steer the cron target ``name`` (its own, or admin)."""
    target = app.crons.get(name)
    return target is not None and ("admin" in session.scopes or target["owner"] == session.key_name)


def steered(request: Request, form: Form, app: App, pages: Pages) -> tuple[Session, str] | Response:
    """The session and the cron target a POST of the cron page steers: one the
    session's key may steer (owns), else the answer refusing it."""
    guarded = pages.guard(request, form, "cron:manage")
    if not isinstance(guarded, Session):
        return guarded
    name = form.get("name", "")
    if not owns(app, guarded, name):
        return pages.done(request, "/crons", f"No cron target named {name}.")
    return guarded, name


@router.post("/crons/call")
def call_cron(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    target = steered(request, form, app, pages)
    if not isinstance(target, tuple):
        return target
    guarded, name = target
    now = app.engine.now()
    if not app.crons.call_now(name, now, actor=f"dashboard:{guarded.key_name}"):
        return pages.done(request, "/crons", f"No cron target named {name}.")
    return pages.done(request, "/crons", f"Queued a call of cron target {name}.")


@router.post("/crons/pause")
def pause_cron(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    target = steered(request, form, app, pages)
    if not isinstance(target, tuple):
        return target
    guarded, name = target
    paused = form.get("paused") == "1"
    if not app.crons.set_paused(name, paused, actor=f"dashboard:{guarded.key_name}"):
        return pages.done(request, "/crons", f"No cron target named {name}.")
    return pages.done(request, "/crons", f"{'Paused' if paused else 'Resumed'} cron target {name}.")


@router.post("/crons/edit")
def edit_cron(request: Request, form: Form, app: ExpiryApp, pages: DashboardPages) -> Response:
    """Point a target at another URL, schedule, time zone or call timeout
    (checked as the API checks them; a blank timeout: [http] call_timeout)."""
    target = steered(request, form, app, pages)
    if not isinstance(target, tuple):
        return target
    guarded, name = target
    try:
        timeout = form.get("timeout_seconds", "").strip()
        changed = app.crons.update(
            name,
            http_url=form.get("http_url", "").strip() or None,
            schedule=form.get("schedule", "").strip() or None,
            timezone=form.get("timezone", "").strip() or None,
            timeout=_seconds(timeout) if timeout else None,
            actor=f"dashboard:{guarded.key_name}",
        )
    except ConfigError as exc:
        return pages.done(request, "/crons", f"Cron target {name} not changed: {exc}")
    if changed is None:
        return pages.done(request, "/crons", f"No cron target named {name}.")
    return pages.done(request, "/crons", f"Changed cron target {name}.")


def _seconds(text: str) -> float:
    """A form's number of seconds; ConfigError for anything else."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"timeout_seconds {text!r} is not a number of seconds") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"timeout_seconds {text!r} is not a number of seconds")
    return value
