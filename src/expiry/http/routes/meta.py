"""Health, Prometheus metrics and discovery: what a caller without a key can
ask of the server (all but one capability's full document)."""

from __future__ import annotations

import threading
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, PlainTextResponse

from ... import defaults
from ...config import HttpConfig
from ...health.metrics import render
from ...queue.jobs import is_reserved
from ...times import format_time
from ..deps import ExpiryApp, require_key
from ..discovery import capabilities, describe
from ..errors import NOT_FOUND, ApiError

router = APIRouter()


@router.get("/v1/health", tags=["meta"])
def health(app: ExpiryApp) -> dict[str, Any]:
    return {"ok": True, "database": app.engine.dialect, "now": format_time(app.engine.now())}


class Scrapes:
    """The last /metrics text, kept ``[http] metrics_cache`` seconds: the
    database's aggregates are read at most that often, however often (or by
    how many) /metrics is scraped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at, self.body, self.content_type = -1e18, b"", ""


@router.get("/metrics", tags=["meta"], response_class=PlainTextResponse)
def metrics(request: Request, app: ExpiryApp) -> PlainTextResponse:
    http = app.config.http if app.config is not None else HttpConfig()
    principal = request.scope.get("state", {}).get("principal")
    if http.metrics_key and (principal is None or not principal.can("read")):
        raise ApiError(403, "forbidden", "/metrics needs a key with the read scope")
    shown = {defaults.QUEUE, *http.metrics_queues}
    scrapes: Scrapes = request.app.state.scrapes
    with scrapes.lock:
        if time.monotonic() - scrapes.at >= http.metrics_cache:
            text = render(app, lambda q: is_reserved(q) or q in shown)
            scrapes.body, scrapes.content_type = text
            scrapes.at = time.monotonic()
        return PlainTextResponse(scrapes.body, media_type=scrapes.content_type)


@router.get("/v1/discovery", tags=["discovery"])
def index() -> dict[str, Any]:
    return capabilities()


@router.get(
    "/v1/discovery/{capability}",
    tags=["discovery"],
    dependencies=[Depends(require_key)],
    responses=NOT_FOUND,
)
def capability(capability: str, request: Request) -> dict[str, Any]:
    # The examples call the address this request reached.
    found = describe(request.app, capability, str(request.base_url))
    if found is None:
        raise ApiError(404, "not_found", f"no capability {capability!r}; see GET /v1/discovery")
    return found


SWAGGER_UI = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5.17.14"
"""Swagger UI, one pinned version; its two files are checked against these
hashes (Subresource Integrity: the npm package's files, which the CDN serves
byte for byte), so a changed file is refused by the browser, not run."""
SWAGGER_UI_JS = "sha384-wmyclcVGX/WhUkdkATwhaK1X1JtiNrr2EoYJ+diV3vj4v6OC5yCeSu+yW13SYJep"
SWAGGER_UI_CSS = "sha384-wxLW6kwyHktdDGr6Pv1zgm/VGJh99lfUbzSn6HNHBENZlCN7W602k9VkGdxuFvPn"
DOCS_POLICY = (
    "default-src 'none'; script-src 'self' https://cdn.jsdelivr.net; "
    "style-src https://cdn.jsdelivr.net 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The reference page's CSP: scripts from this server (docs.js) and the pinned
CDN files only, no inline script; requests to this server alone."""


@router.get("/docs", include_in_schema=False, response_class=HTMLResponse)
def docs() -> HTMLResponse:
    """The API's reference, Swagger UI over /openapi.json."""
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>expiry API</title>
<link rel="stylesheet" href="{SWAGGER_UI}/swagger-ui.css" integrity="{SWAGGER_UI_CSS}"
      crossorigin="anonymous"></head>
<body><div id="swagger-ui"></div>
<script src="{SWAGGER_UI}/swagger-ui-bundle.js" integrity="{SWAGGER_UI_JS}"
        crossorigin="anonymous"></script>
<script src="/static/docs.js"></script></body></html>"""
    return HTMLResponse(
        page,
        headers={
            "Content-Security-Policy": DOCS_POLICY,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )
