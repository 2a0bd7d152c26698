"""What the routes share, as FastAPI dependencies: the App, the caller's key
(checked and rate-limited), and the dashboard's pages.

``attach`` keeps the App and what lives as long as the server on
``api.state``; the getters read them back. A route is a module-level function
that names what it needs:

    @router.get("/cron")
    def cron_list(_: Key, app: ExpiryApp) -> list[m.CronTarget]: ...

The getters are ``async`` so that FastAPI calls them on the event loop rather
than sending each to the thread pool; ``require_key`` reads the database (when
its cache of key hashes is stale), so it stays a plain function.
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from ..app import App
from ..config import HttpConfig
from ..keys import Keys
from .errors import ApiError
from .render import Pages
from .security import RateLimiter, bearer
from .sessions import Sessions
from .views import WatermarkHistory


def attach(api: FastAPI, app: App, http: HttpConfig) -> None:
    """Keep ``app``, its keys (one cache for the API, the Idempotency-Key owner and
    the dashboard), the rate limiter's buckets and the dashboard's pages and
    watermark history on ``api.state``."""
    keys = app.keys
    api.state.expiry = app
    api.state.keys = keys
    api.state.limiter = RateLimiter(http.rate_limit_per_second, http.rate_limit_burst)
    api.state.pages = Pages(app.engine, Sessions(keys))
    api.state.history = WatermarkHistory()


async def get_app(request: Request) -> App:
    app: App = request.app.state.expiry
    return app


async def get_keys(request: Request) -> Keys:
    keys: Keys = request.app.state.keys
    return keys


async def get_limiter(request: Request) -> RateLimiter:
    limiter: RateLimiter = request.app.state.limiter
    return limiter


async def get_pages(request: Request) -> Pages:
    pages: Pages = request.app.state.pages
    return pages


async def get_history(request: Request) -> WatermarkHistory:
    history: WatermarkHistory = request.app.state.history
    return history


ExpiryApp = Annotated[App, Depends(get_app)]
ApiKeys = Annotated[Keys, Depends(get_keys)]
Limiter = Annotated[RateLimiter, Depends(get_limiter)]
DashboardPages = Annotated[Pages, Depends(get_pages)]
History = Annotated[WatermarkHistory, Depends(get_history)]


def require_key(request: Request, keys: ApiKeys, limiter: Limiter) -> str:
    """The name of the caller's key: 401 without a valid one, 429 over its rate limit."""
    secret = bearer(request.headers.get("authorization", ""))
    name = keys.resolve(secret) if secret is not None else None
    if name is None:
        raise ApiError(
            401,
            "unauthorized",
            "send a valid API key: Authorization: Bearer KEY "
            "(create one with `expiry keys create NAME`)",
        )
    wait = limiter.take(name)
    if wait > 0:
        raise ApiError(
            429,
            "rate_limited",
            f"too many requests for key {name!r}; retry in {math.ceil(wait)}s",
            {"Retry-After": str(max(1, math.ceil(wait)))},
        )
    return name


Key = Annotated[str, Depends(require_key)]
"""The caller's key name; a route that takes it is closed to unknown callers."""
