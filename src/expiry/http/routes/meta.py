"""Health, Prometheus metrics and discovery: what a caller without a key can
ask of the server (all but one capability's full document)."""

from __future__ import annotations

import threading
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from ... import defaults
from ...config import HttpConfig
from ...metrics import render
from ...queue import is_reserved
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
