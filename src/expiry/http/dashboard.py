"""The web dashboard at ``/``: server-rendered pages to see and steer expiry.

Every page reads without JavaScript; the one vendored script (static/dashboard.js)
only refreshes live pages and asks before destructive actions. Sign-in takes an
API key and sets a signed session cookie (see sessions.py); every POST that
changes state carries the session's CSRF token or is refused with 403. Bulk
actions go through a page that names how many jobs they will touch.

Forms are read from the raw body: the API's BodyLimit middleware treats every
POST body as JSON, and this keeps python-multipart out of the dependencies.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import parse_qs, quote, unquote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from .. import status as status_view
from ..errors import ExpiryError
from ..types import JobState
from . import views as v
from .security import KeyRing
from .sessions import COOKIE, Session, Sessions

if TYPE_CHECKING:
    from ..app import App

FLASH = "expiry_flash"
STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
NAV = (
    ("/", "Overview"),
    ("/runs", "Runs"),
    ("/queue", "Queue"),
    ("/jobs", "Jobs"),
    ("/dlq", "Dead letters"),
    ("/crons", "Cron targets"),
    ("/audit", "Audit log"),
)
LIVE_PAGES = {"/", "/runs", "/queue", "/crons"}
"""Pages the script refreshes in place (every 10 seconds while visible)."""


async def read_form(request: Request) -> dict[str, str]:
    """The url-encoded form in the body; for a repeated field, its last value."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: vs[-1] for k, vs in parse_qs(body, keep_blank_values=True).items()}


Form = Annotated[dict[str, str], Depends(read_form)]


def local_path(target: str | None) -> str:
    """``target`` if it is a path on this site, else "/" (no open redirects)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def _static_version() -> str:
    digest = hashlib.sha256()
    for name in sorted(STATIC):
        digest.update(resources.files(__package__).joinpath("static", name).read_bytes())
    return digest.hexdigest()[:12]


def templates() -> Environment:
    env = Environment(
        loader=PackageLoader("expiry.http", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["quote"] = lambda text: quote(str(text), safe="")
    env.filters["duration"] = v.short_duration
    env.filters["pretty"] = v.pretty_json
    env.filters["plural"] = _plural
    env.globals.update(nav=NAV, static_version=_static_version(), states=list(JobState))
    return env


class Pages:
    """Renders pages with the session, the database's now and the security headers."""

    def __init__(self, app: App, sessions: Sessions) -> None:
        self.app, self.sessions, self.env = app, sessions, templates()

    def session(self, request: Request) -> Session | None:
        return self.sessions.read(request.cookies.get(COOKIE))

    def render(
        self,
        request: Request,
        template: str,
        session: Session | None,
        status: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        now = self.app.engine.now()

        def query(**changes: Any) -> str:
            params = {**request.query_params, **{k: str(x) for k, x in changes.items()}}
            kept = {k: x for k, x in params.items() if x not in ("", "None")}
            return request.url.path + ("?" + urlencode(kept) if kept else "")

        html = self.env.get_template(template).render(
            request=request,
            path=request.url.path,
            here=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            session=session,
            now=now,
            stamp=lambda value: v.stamp(value, now),
            query=query,
            live=request.url.path in LIVE_PAGES,
            flash=unquote(request.cookies.get(FLASH) or "") or None,
            **context,
        )
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if request.cookies.get(FLASH):
            response.delete_cookie(FLASH, path="/")
        return response

    def to_login(self, request: Request) -> RedirectResponse:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return secured(RedirectResponse("/login?" + urlencode({"next": target}), 303))

    def done(self, request: Request, target: str | None, message: str) -> RedirectResponse:
        """After a POST: back to a page, with a one-time message."""
        response = secured(RedirectResponse(local_path(target), 303))
        response.set_cookie(
            FLASH,
            quote(message),
            max_age=60,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    def guard(self, request: Request, form: dict[str, str]) -> Session | Response:
        """The session of a state-changing POST, or the response refusing it."""
        session = self.session(request)
        if session is None:
            return self.to_login(request)
        if not Sessions.csrf_ok(session, form.get("csrf")):
            return self.render(request, "refused.html", session, status=403)
        return session


def secured(response: RedirectResponse) -> RedirectResponse:
    response.headers.update(SECURITY_HEADERS)
    return response


def page_number(text: str | None) -> int:
    return max(1, min(int(text), 10_000)) if text and text.isdigit() else 1


def dashboard_router(app: App, keys: KeyRing) -> APIRouter:
    """Every dashboard route; mounted by create_app, left out of the OpenAPI schema."""
    pages = Pages(app, Sessions(app, keys))
    history = v.WatermarkHistory()
    router = APIRouter(include_in_schema=False)
    _sign_in_routes(router, pages)
    _reading_routes(router, pages, history)
    _job_routes(router, pages)
    _steering_routes(router, pages)

    @router.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC:
            return Response("not found", 404, media_type="text/plain")
        body = resources.files(__package__).joinpath("static", name).read_bytes()
        return Response(
            body, media_type=STATIC[name], headers={"Cache-Control": "public, max-age=3600"}
        )

    return router


def _sign_in_routes(router: APIRouter, pages: Pages) -> None:
    @router.get("/login")
    def login_form(request: Request, next: str = "/") -> Response:
        if pages.session(request) is not None:
            return secured(RedirectResponse(local_path(next), 303))
        return pages.render(request, "login.html", None, next=local_path(next))

    @router.post("/login")
    def login(request: Request, form: Form) -> Response:
        target = local_path(form.get("next"))
        cookie = pages.sessions.sign_in(form.get("key", ""))
        if cookie is None:
            return pages.render(
                request,
                "login.html",
                None,
                status=401,
                next=target,
                error="That key is not valid: paste a key made with `expiry keys create NAME`.",
            )
        response = secured(RedirectResponse(target, 303))
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=pages.sessions.max_age,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @router.post("/logout")
    def logout(request: Request, form: Form) -> Response:
        guarded = pages.guard(request, form)
        if not isinstance(guarded, Session):
            return guarded
        response = secured(RedirectResponse("/login", 303))
        response.delete_cookie(COOKIE, path="/")
        return response


def _reading_routes(router: APIRouter, pages: Pages, history: v.WatermarkHistory) -> None:
    app = pages.app

    @router.get("/")
    def overview(request: Request) -> Response:
        session = pages.session(request)
        if session is None:
            return pages.to_login(request)
        error = None
        try:
            policies = status_view.policies(app)
        except ExpiryError as exc:
            policies, error = [], str(exc)
        now = app.engine.now()
        config = {p.name: p for p in (app.cleanup.policies if app.cleanup else [])}
        for row in policies:
            history.record(row["name"], now, row["watermark_seconds"])
            series = history.series(row["name"])
            policy = config.get(row["name"])
            row.update(
                level=v.level(policy, row["watermark_seconds"]),
                warn=policy.watermark_warn if policy else None,
                alert=policy.watermark_alert if policy else None,
                trend=v.trend(series),
                spark=v.sparkline(series),
                samples=len(series),
            )
        stats = app.queue.stats()
        totals: dict[str, int] = {}
        for states in stats.by_state.values():
            for state, n in states.items():
                totals[state] = totals.get(state, 0) + n
        return pages.render(
            request,
            "overview.html",
            session,
            policies=policies,
            error=error,
            totals=totals,
            has_config=app.cleanup is not None,
            crons=len(app.crons.targets()),
        )

    @router.get("/runs")
    def runs(request: Request, policy: str = "", page: str = "1") -> Response:
        session = pages.session(request)
        if session is None:
            return pages.to_login(request)
        number = page_number(page)
        limit = min(number * v.PAGE_SIZE + 1, v.SCAN_LIMIT)
        with app.engine.transaction() as conn:
            found = app.engine.rows(conn, "run_list", {"policy": policy or None, "limit": limit})
        listed = v.page_of(found, number)
        summaries = [s for r in listed.items if (s := status_view.run_summary(app, r["id"]))]
        return pages.render(
            request,
            "runs.html",
            session,
            runs=summaries,
            page=listed,
            policy=policy,
            policy_names=[p.name for p in (app.cleanup.policies if app.cleanup else [])],
        )

    @router.get("/runs/{run_id:path}")
    def run(request: Request, run_id: str) -> Response:
        session = pages.session(request)
        if session is None:
            return pages.to_login(request)
        summary = status_view.run_summary(app, run_id)
        if summary is None:
            return pages.render(
                request, "missing.html", session, status=404, what=f"run {run_id}"
            )
        dead, _ = v.find_jobs(app, JobState.DEAD, run_id=run_id)
        events, _ = v.audit_events(app, policy=summary["policy"], run_id=run_id)
        by_state = v.bars([(s, n, str(n)) for s, n in sorted(summary["jobs_by_state"].items())])
        return pages.render(
            request,
            "run.html",
            session,
            run=summary,
            by_state=by_state,
            dead=dead[:50],
            events=events[:50],
        )

    @router.get("/queue")
    def queue(request: Request) -> Response:
        session = pages.session(request)
        if session is None:
            return pages.to_login(request)
        return pages.render(request, "queue.html", session, **_queue_charts(app))

    @router.get("/crons")
    def crons(request: Request) -> Response:
        session = pages.session(request)
        if session is None:
            return pages.to_login(request)
        targets = app.crons.targets()
        for target in targets:
            target["calls"] = app.crons.calls(target["name"], limit=5)
        return pages.render(request, "crons.html", session, targets=targets)

    @router.get("/audit")
    def audit(request: Request, policy: str = "", action: str = "", page: str = "1") -> Response:
        session = pages.session(request)
        if session is None:
            return pages.to_login(request)
        every, truncated = v.audit_events(app, policy=policy or None)
        actions = sorted({e["action"] for e in every})
        chosen = [e for e in every if not action or e["action"] == action]
        listed = v.page_of(chosen, page_number(page), total=len(chosen), truncated=truncated)
        return pages.render(
            request,
            "audit.html",
            session,
            page=listed,
            policy=policy,
            action=action,
            actions=actions,
            policy_names=[p.name for p in (app.cleanup.policies if app.cleanup else [])],
        )


def _queue_charts(app: App) -> dict[str, Any]:
    view = status_view.queue(app)
    now = app.engine.now()
    states = [s.value for s in JobState]
    by_queue = view["jobs_by_queue_and_state"]
    rows = []
    for name, counts in sorted(by_queue.items()):
        total = sum(counts.values())
        rows.append({"queue": name, "counts": counts, "total": total})
    top = max((r["total"] for r in rows), default=0) or 1
    for r in rows:
        offset, segments = 0.0, []
        for state in states:
            n = r["counts"].get(state, 0)
            if n:
                segments.append({"state": state, "n": n, "x": offset, "w": n / top})
                offset += n / top
        r["segments"] = segments
    due_ages: list[float] = []
    for state in (JobState.AVAILABLE, JobState.RETRYABLE, JobState.SCHEDULED):
        for job in app.engine.job_list(state, None, v.SCAN_LIMIT):
            age = (now - job.run_at).total_seconds()
            if age >= 0:
                due_ages.append(age)
    oldest = v.bars(
        [(q, age, v.short_duration(age)) for q, age in sorted(view["oldest_due_seconds"].items())]
    )
    running = sorted(view["running"], key=lambda r: -r["held_seconds"])[:20]
    return {
        "states": states,
        "by_queue": rows,
        "oldest": oldest,
        "due_ages": v.age_histogram(due_ages),
        "due_count": len(due_ages),
        "running": v.bars(
            [(r["job"], r["held_seconds"], v.short_duration(r["held_seconds"])) for r in running]
        ),
        "running_queues": {r["job"]: r["queue"] for r in running},
        "running_total": len(view["running"]),
        "retries": v.bars(
            [(k, n, str(n)) for k, n in sorted(view["retries_by_kind"].items(), key=lambda i: -i[1])]
        ),
        "dead": view["dead"],
    }


def _job_routes(router: APIRouter, pages: Pages) -> None:
    app = pages.app

    def listing(
        request: Request, session: Session, state: JobState, dlq: bool, filters: dict[str, str]
    ) -> Response:
        jobs, truncated = v.find_jobs(
            app,
            state,
            queue=filters["queue"] or None,
            policy=filters["policy"] or None,
            run_id=filters.get("run") or None,
        )
        listed = v.page_of(jobs, page_number(filters["page"]), total=len(jobs), truncated=truncated)
        return pages.render(
            request,
            "jobs.html",
            session,
            dlq=dlq,
            state=state.value,
            page=listed,
            filters=filters,
            queues=sorted(app.queue.stats().by_state),
            policy_names=[p.name for p in (app.cleanup.policies if app.cleanup else [])],
            job_policy=v.job_policy,
        )

    @router.get("/jobs")
    def jobs(
        request: Request,
        state: str = "available",
        queue: str = "",
        policy: str = "",
        run: str = "",
        page: str = "1",
    ) -> Response:
        session = pages.session(request)
        if session is None:
            return pages.to_login(request)
        chosen = JobState(state) if state in JobState._value2member_map_ else JobState.AVAILABLE
        filters = {"queue": queue, "policy": policy, "run": run, "page": page}
        return listing(request, session, chosen, False, filters)

    @router.get("/dlq")
    def dlq(request: Request, queue: str = "", policy: str = "", page: str = "1") -> Response:
        session = pages.session(request)
        if session is None:
            return pages.to_login(request)
        filters = {"queue": queue, "policy": policy, "page": page}
        return listing(request, session, JobState.DEAD, True, filters)

    @router.get("/jobs/{key:path}")
    def job(request: Request, key: str) -> Response:
        session = pages.session(request)
        if session is None:
            return pages.to_login(request)
        found = app.queue.get(key)
        if found is None:
            return pages.render(request, "missing.html", session, status=404, what=f"job {key}")
        events, truncated = v.audit_events(app, job_key=key)
        return pages.render(
            request,
            "job.html",
            session,
            job=found,
            policy=v.job_policy(found),
            attempts=v.attempts(found),
            events=events,
            events_truncated=truncated,
            waiting=found.state.value in ("scheduled", "available", "retryable"),
        )


def _plural(n: int, word: str = "job") -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _steering_routes(router: APIRouter, pages: Pages) -> None:
    app = pages.app

    @router.post("/dlq/redrive")
    def redrive(request: Request, form: Form) -> Response:
        guarded = pages.guard(request, form)
        if not isinstance(guarded, Session):
            return guarded
        keys = [form["key"]] if form.get("key") else []
        done = app.queue.redrive(keys, actor=f"dashboard:{guarded.key_name}")
        message = f"Redrove {_plural(len(done))}." if done else "Nothing to redrive: not dead."
        return pages.done(request, form.get("next"), message)

    @router.post("/dlq/discard")
    def discard(request: Request, form: Form) -> Response:
        guarded = pages.guard(request, form)
        if not isinstance(guarded, Session):
            return guarded
        keys = [form["key"]] if form.get("key") else []
        done = app.queue.discard(keys, actor=f"dashboard:{guarded.key_name}")
        message = f"Discarded {_plural(len(done))}." if done else "Nothing to discard."
        return pages.done(request, form.get("next"), message)

    def matching(queue: str, policy: str) -> tuple[list[str], bool]:
        jobs, truncated = v.find_jobs(
            app, JobState.DEAD, queue=queue or None, policy=policy or None
        )
        return [j.key for j in jobs], truncated

    @router.get("/dlq/bulk")
    def bulk_confirm(
        request: Request, action: str = "redrive", queue: str = "", policy: str = ""
    ) -> Response:
        session = pages.session(request)
        if session is None:
            return pages.to_login(request)
        keys, truncated = matching(queue, policy)
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
    def bulk(request: Request, form: Form) -> Response:
        guarded = pages.guard(request, form)
        if not isinstance(guarded, Session):
            return guarded
        action = "discard" if form.get("action") == "discard" else "redrive"
        queue, policy = form.get("queue", ""), form.get("policy", "")
        keys, truncated = matching(queue, policy)
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
            done = app.queue.redrive(keys, actor=actor)
            message = f"Redrove {_plural(len(done))}."
        else:
            done = app.queue.discard(keys, actor=actor)
            message = f"Discarded {_plural(len(done))}."
        target = "/dlq?" + urlencode({k: x for k, x in (("queue", queue), ("policy", policy)) if x})
        return pages.done(request, target.rstrip("?"), message)

    @router.post("/policies/pause")
    def pause_policy(request: Request, form: Form) -> Response:
        from ..scheduler import Scheduler

        guarded = pages.guard(request, form)
        if not isinstance(guarded, Session):
            return guarded
        name, paused = form.get("policy", ""), form.get("paused") == "1"
        if app.cleanup is None:
            return pages.done(request, form.get("next"), "Not changed: this server has no policies.")
        try:
            Scheduler(app).set_paused(name, paused, actor=f"dashboard:{guarded.key_name}")
        except ExpiryError as exc:
            return pages.done(request, form.get("next"), f"Not changed: {exc}")
        return pages.done(
            request, form.get("next"), f"{'Paused' if paused else 'Resumed'} policy {name}."
        )

    @router.post("/crons/pause")
    def pause_cron(request: Request, form: Form) -> Response:
        guarded = pages.guard(request, form)
        if not isinstance(guarded, Session):
            return guarded
        name, paused = form.get("name", ""), form.get("paused") == "1"
        if not app.crons.set_paused(name, paused):
            return pages.done(request, "/crons", f"No cron target named {name}.")
        app.engine.audit_append(
            None,
            "cron.paused" if paused else "cron.resumed",
            actor=f"dashboard:{guarded.key_name}",
            detail={"name": name},
        )
        return pages.done(
            request, "/crons", f"{'Paused' if paused else 'Resumed'} cron target {name}."
        )
