"""The web dashboard at ``/``: server-rendered pages to see and steer expiry;
this module is its door (sign-in, sign-out) and its static files.

Every page reads without JavaScript; the one vendored script (static/dashboard.js)
only refreshes live pages and asks before destructive actions. Sign-in takes an
API key and sets a signed session cookie (see sessions.py); every POST that
changes state carries the session's CSRF token or is refused with 403. Bulk
actions go through a page that names how many jobs they will touch.

The pieces: routes/pages.py (the reading pages), routes/steering.py (the POST
actions), render.py (templates, headers, the session guard), views.py (what
pages show), sessions.py (cookies and CSRF), templates/ and static/. None of
the dashboard's routes is in the OpenAPI schema.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from ...types import AuditAction
from ..deps import DashboardPages
from ..render import STATIC, Form, local_path, secured, static_file
from ..sessions import COOKIE, LOGIN_COOKIE, Session

log = logging.getLogger("expiry.http")
router = APIRouter(include_in_schema=False)


def login_page(
    request: Request, pages: DashboardPages, status: int = 200, **context: object
) -> Response:
    """The sign-in form with a fresh token, and the cookie that token matches."""
    value, token = pages.sessions.login_token()
    page = pages.render(request, "login.html", None, status=status, login_token=token, **context)
    page.set_cookie(
        LOGIN_COOKIE,
        value,
        max_age=3600,
        path="/login",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return page


@router.get("/login")
def login_form(request: Request, pages: DashboardPages, next: str = "/") -> Response:
    if pages.session(request) is not None:
        return secured(RedirectResponse(local_path(next), 303))
    return login_page(request, pages, next=local_path(next))


@router.post("/login")
def login(request: Request, form: Form, pages: DashboardPages) -> Response:
    """Sign in with an API key. Every sign-in is audited, and refused ones up to
    a bound for all addresses together (Sessions.refusals_audited; past it they
    are logged); an address past its refused attempts (Sessions.failures) gets
    429 without a check."""
    target = local_path(form.get("next"))
    client = request.client.host if request.client else "unknown"
    sessions = pages.sessions
    wait = sessions.failures.wait(client)
    if wait:
        slow = login_page(request, pages, 429, next=target, error=True, slow_down=wait)
        slow.headers["Retry-After"] = str(max(1, round(wait)))
        return slow
    if not sessions.login_token_ok(request.cookies.get(LOGIN_COOKIE), form.get("csrf")):
        return login_page(request, pages, 403, next=target, expired=True)
    cookie = sessions.sign_in(form.get("key", ""))
    _audit_sign_in(pages, cookie, client)
    if cookie is None:
        sessions.failures.take(client)
        return login_page(request, pages, 401, next=target, error=True)
    response = secured(RedirectResponse(target, 303))
    response.delete_cookie(LOGIN_COOKIE, path="/login")
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


def _audit_sign_in(pages: DashboardPages, cookie: str | None, client: str) -> None:
    """Audit a sign-in, or a refused one while refusals are few enough (else
    log it)."""
    sessions = pages.sessions
    session = sessions.read(cookie) if cookie else None
    if session is not None:
        pages.audit(
            AuditAction.SIGNED_IN,
            actor=f"dashboard:{session.key_name}",
            detail={"client": client},
        )
    elif sessions.refusals_audited.take("all") == 0:
        pages.audit(AuditAction.SIGN_IN_REFUSED, actor="dashboard", detail={"client": client})
    else:
        log.warning("sign-in refused, not audited (too many at once)", extra={"client": client})


@router.post("/logout")
def logout(request: Request, form: Form, pages: DashboardPages) -> Response:
    guarded = pages.guard(request, form)
    if not isinstance(guarded, Session):
        return guarded
    pages.sessions.sign_out(guarded)  # the cookie is refused even if a copy survives
    pages.audit(AuditAction.SIGNED_OUT, actor=f"dashboard:{guarded.key_name}", detail={})
    response = secured(RedirectResponse("/login", 303))
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC:
        return Response("not found", 404, media_type="text/plain")
    return Response(
        static_file(name),
        media_type=STATIC[name],
        headers={"Cache-Control": "public, max-age=3600"},
    )
