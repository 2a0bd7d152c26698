"""Health, Prometheus metrics and discovery: what a caller without a key can
ask of the server (all but one capability's full document)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from ...metrics import render
from ...times import format_time
from ..deps import ExpiryApp, require_key
from ..discovery import capabilities, describe
from ..errors import NOT_FOUND, ApiError

router = APIRouter()


@router.get("/v1/health", tags=["meta"])
def health(app: ExpiryApp) -> dict[str, Any]:
    return {"ok": True, "database": app.engine.dialect, "now": format_time(app.engine.now())}


@router.get("/metrics", tags=["meta"], response_class=PlainTextResponse)
def metrics(app: ExpiryApp) -> PlainTextResponse:
    body, content_type = render(app)
    return PlainTextResponse(body, media_type=content_type)


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
