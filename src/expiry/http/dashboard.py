"""The web dashboard at ``/``: server-rendered pages to see and steer expiry.

Every page reads without JavaScript; the one vendored script (static/dashboard.js)
only refreshes live pages and asks before destructive actions. Sign-in takes an
API key and sets a signed session cookie (see sessions.py); every POST that
changes state carries the session's CSRF token or is refused with 403. Bulk
actions go through a page that names how many jobs they will touch.

The pieces: render.py (templates, headers, the session guard), pages.py (the
reading pages), steering.py (the POST actions), views.py (what pages show),
sessions.py (cookies and CSRF), templates/ and static/.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from . import views as v
from .pages import job_routes, reading_routes
from .render import STATIC, Form, Pages, local_path, secured
from .security import KeyRing
from .sessions import COOKIE, Session, Sessions
from .steering import steering_routes

if TYPE_CHECKING:
    from ..app import App


def dashboard_router(app: App, keys: KeyRing) -> APIRouter:
    """Every dashboard route; mounted by create_app, left out of the OpenAPI schema."""
    pages = Pages(app, Sessions(app, keys))
    history = v.WatermarkHistory()
    router = APIRouter(include_in_schema=False)
    _sign_in_routes(router, pages)
    reading_routes(router, pages, history)
    job_routes(router, pages)
    steering_routes(router, pages)

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
                error=True,
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
