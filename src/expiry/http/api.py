"""The HTTP API: plain JSON under /v1, bearer keys, errors with stable codes.

Every error body is ``{"error": {"code": ..., "message": ...}}``. Bad JSON,
wrong types and unknown fields get 422; a message over 256 KiB or a body over
the limit gets 413; an unknown key 401; too many requests 429 with
Retry-After. The routes are thin: they validate, call the library, shape the
answer.
"""

from __future__ import annotations

from fastapi import FastAPI

from ..app import App
from ..config import HttpConfig
from .deps import attach
from .errors import COMMON, DatabaseUnavailable, add_handlers
from .idempotency import IdempotencyMiddleware
from .routes import cleanup, cron, dashboard, dlq, meta, pages, queue, steering
from .security import BodyLimit, Idempotency, KeyGate

ROUTERS = (meta, queue, cron, cleanup, dlq, dashboard, pages, steering)
"""The route modules, each one APIRouter, in the order they are mounted."""


def create_app(app: App) -> FastAPI:
    """The ASGI application for ``expiry serve``: the API and the dashboard over ``app``."""
    http = app.config.http if app.config is not None else HttpConfig()
    # /docs is meta.py's: Swagger UI pinned, checked by hash, under a CSP.
    api = FastAPI(
        title="expiry",
        version="1",
        description=__doc__,
        responses=COMMON,
        docs_url=None,
        redoc_url=None,
    )
    attach(api, app, http)
    api.state.scrapes = meta.Scrapes()
    add_handlers(api)
    for module in ROUTERS:
        api.include_router(module.router)
    # The last added runs first: DatabaseUnavailable wraps everything; KeyGate
    # answers from the headers alone, before any body is read; BodyLimit reads
    # the body whole (up to the limit) for the idempotency store and the routes.
    api.add_middleware(IdempotencyMiddleware, store=Idempotency(app.engine))
    api.add_middleware(
        BodyLimit,
        limit=http.max_body_bytes,
        form_limit=http.form_body_bytes,
        timeout=http.body_timeout,
    )
    api.add_middleware(
        KeyGate,
        keys=api.state.keys,
        per_key=api.state.limiter,
        anonymous=api.state.anonymous,
        forms=api.state.forms,
        metrics_key=http.metrics_key,
    )
    api.add_middleware(DatabaseUnavailable, engine=app.engine)
    return api
