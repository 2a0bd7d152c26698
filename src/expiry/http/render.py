"""Rendering dashboard pages: the templates, the signed-in session, the
database's now, one-time messages and the security headers every page carries.

Forms are read from the raw body: the API's BodyLimit middleware treats every
POST body as JSON, and this keeps python-multipart out of the dependencies.
"""

from __future__ import annotations

import hashlib
import logging
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import parse_qs, quote, unquote, urlencode

from fastapi import Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from ..types import AuditAction, JobState
from . import views as v
from .sessions import COOKIE, Session, Sessions

log = logging.getLogger("expiry.http")

if TYPE_CHECKING:
    from ..engines import Engine

FLASH = "expiry_flash"
STATIC = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "docs.js": "text/javascript",
}
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
    ("/workers", "Workers"),
    ("/crons", "Cron targets"),
    ("/audit", "Audit log"),
)
LIVE_PAGES = {"/", "/runs", "/queue", "/workers", "/crons"}
"""Pages the script refreshes in place (every 10 seconds while visible)."""


async def read_form(request: Request) -> dict[str, str]:
    """The url-encoded form in the body; for a repeated field, its last value."""
    body = (await request.body()).decode("utf-8", "replace")
    try:  # off the event loop, and at most FORM_FIELDS fields (BodyLimit caps the bytes)
        fields = await run_in_threadpool(
            parse_qs, body, keep_blank_values=True, max_num_fields=FORM_FIELDS
        )
    except ValueError:
        raise HTTPException(413, f"a dashboard form has at most {FORM_FIELDS} fields") from None
    return {k: vs[-1] for k, vs in fields.items()}


FORM_FIELDS = 64
"""The most fields a dashboard form may carry (its own forms send under ten)."""


Form = Annotated[dict[str, str], Depends(read_form)]


def local_path(target: str | None) -> str:
    """``target`` if it is a path on this site, else "/" (no open redirects)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def static_file(name: str) -> bytes:
    """One of the files in STATIC, as shipped in the package."""
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _static_version() -> str:
    digest = hashlib.sha256()
    for name in sorted(STATIC):
        digest.update(static_file(name))
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
    env.filters["compact"] = v.compact_json
    env.filters["plural"] = v.plural
    env.globals.update(nav=NAV, static_version=_static_version(), states=list(JobState))
    return env


class Pages:
    """Renders pages with the session, the database's now and the security headers."""

    def __init__(self, engine: Engine, sessions: Sessions) -> None:
        self.engine, self.sessions, self.env = engine, sessions, templates()

    def session(self, request: Request) -> Session | None:
        return self.sessions.read(request.cookies.get(COOKIE))

    def audit(self, action: AuditAction, *, actor: str, detail: dict[str, Any]) -> None:
        """Append a dashboard event (sign-in, sign-out) to the audit log. On a
        database that refuses writes (a hot standby, a read-only role) the
        reading pages still serve: the event is logged, not stored."""
        try:
            with self.engine.transaction() as conn:
                self.engine.audit_append(conn, action, actor=actor, detail=detail)
        except Exception as exc:
            _, kind = self.engine.classify(exc)
            if kind not in ("read_only", "insufficient_privilege"):
                raise
            log.warning(
                "%s not audited: the database refuses writes (%s)",
                action.value,
                kind,
                extra={"actor": actor},
            )

    def render(
        self,
        request: Request,
        template: str,
        session: Session | None,
        status: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        now = self.engine.now()

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

    def reading(self, request: Request) -> Session | Response:
        """The session of a reading page, which needs the read scope; else the
        sign-in page, or a 403 page naming the scope."""
        session = self.session(request)
        if session is None:
            return self.to_login(request)
        if not session.can("read"):
            return self.render(request, "refused.html", session, status=403, scope="read")
        return session

    def guard(
        self, request: Request, form: dict[str, str], scope: str | None = None
    ) -> Session | Response:
        """The session of a state-changing POST that needs ``scope`` (None:
        signing out), or the response refusing it (no session, no valid CSRF
        token, no such scope)."""
        session = self.session(request)
        if session is None:
            return self.to_login(request)
        if not Sessions.csrf_ok(session, form.get("csrf")):
            return self.render(request, "refused.html", session, status=403)
        if scope is not None and not session.can(scope):
            return self.render(
                request, "refused.html", session, status=403, scope=scope, action=True
            )
        return session


class PageRefused(Exception):  # noqa: N818 (an answer, not an error)
    """The answer a page gives instead of itself: the sign-in redirect, or the
    403 page naming the missing scope (raised by the ``Reading`` dependency,
    answered by http/errors.py)."""

    def __init__(self, response: Response) -> None:
        super().__init__("page refused")
        self.response = response


def secured(response: RedirectResponse) -> RedirectResponse:
    response.headers.update(SECURITY_HEADERS)
    return response


def page_number(text: str | None) -> int:
    return max(1, min(int(text), 10_000)) if text and text.isdigit() else 1
