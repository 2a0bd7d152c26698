"""What the routes share, as FastAPI dependencies: the App, the caller's key
(checked and rate-limited by security.KeyGate before the body is read) and
its scopes, and the dashboard's pages.

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

from typing import Annotated

from fastapi import Depends, FastAPI, Request

from ..app import App
from ..config import HttpConfig
from ..keys import Principal
from .errors import ApiError
from .quotas import Quotas
from .render import PageRefused, Pages
from .security import RateLimiter
from .sessions import Session, Sessions


def attach(api: FastAPI, app: App, http: HttpConfig) -> None:
    """Keep ``app``, its keys (one cache for the API, the Idempotency-Key owner and
    the dashboard), the rate limiter's buckets, the publish quotas and the dashboard's pages on
    ``api.state``."""
    keys = app.keys
    api.state.expiry = app
    api.state.keys = keys
    api.state.limiter = RateLimiter(http.rate_limit_per_second, http.rate_limit_burst)
    api.state.anonymous = RateLimiter(
        http.anonymous_rate_limit_per_second, http.anonymous_rate_limit_burst
    )
    api.state.forms = RateLimiter(
        http.anonymous_rate_limit_per_second, http.anonymous_rate_limit_burst
    )
    api.state.quotas = Quotas(
        app.queue,
        max_queues=http.max_queues_per_key,
        max_pending=http.max_pending_per_key,
        max_bytes=http.max_pending_bytes_per_key,
    )
    api.state.pages = Pages(app.engine, Sessions(keys))


async def get_app(request: Request) -> App:
    app: App = request.app.state.expiry
    return app


async def get_quotas(request: Request) -> Quotas:
    quotas: Quotas = request.app.state.quotas
    return quotas


async def get_pages(request: Request) -> Pages:
    pages: Pages = request.app.state.pages
    return pages


def reading_session(request: Request, pages: Annotated[Pages, Depends(get_pages)]) -> Session:
    """The session of a dashboard reading page (Pages.reading); else PageRefused
    with the sign-in redirect or the 403 page. A plain function: reading the
    session may read the keys from the database."""
    found = pages.reading(request)
    if not isinstance(found, Session):
        raise PageRefused(found)
    return found


ExpiryApp = Annotated[App, Depends(get_app)]
PublishQuotas = Annotated[Quotas, Depends(get_quotas)]
DashboardPages = Annotated[Pages, Depends(get_pages)]
Reading = Annotated[Session, Depends(reading_session)]
"""The signed-in session of a reading page, which needs the read scope."""


async def require_key(request: Request) -> Principal:
    """The caller's key, as security.KeyGate found it from the headers (before
    the body was read, and rate-limited there): 401 without a valid one."""
    principal: Principal | None = request.scope.get("state", {}).get("principal")
    if principal is None:
        raise ApiError(
            401,
            "unauthorized",
            "send a valid API key: Authorization: Bearer KEY "
            "(create one with `expiry keys create NAME`)",
        )
    return principal


Key = Annotated[Principal, Depends(require_key)]
"""The caller's key; a route that takes it is closed to unknown callers. What
it may do is the route's to check (``Reader``, ``Trigger``..., ``Principal.can_queue``)."""


def forbidden(principal: Principal, scope: str) -> ApiError:
    return ApiError(
        403,
        "forbidden",
        f"key {principal.name!r} lacks the scope {scope!r} "
        f"(an operator grants it: expiry keys scope {principal.name} --scope {scope} ...)",
    )


def holding(principal: Principal, scope: str) -> Principal:
    """``principal`` if it holds ``scope`` (or admin), else 403."""
    if not principal.can(scope):
        raise forbidden(principal, scope)
    return principal


async def _reader(principal: Key) -> Principal:
    return holding(principal, "read")


async def _trigger(principal: Key) -> Principal:
    return holding(principal, "cleanup:trigger")


async def _approver(principal: Key) -> Principal:
    return holding(principal, "cleanup:approve")


async def _cron_manager(principal: Key) -> Principal:
    return holding(principal, "cron:manage")


Reader = Annotated[Principal, Depends(_reader)]
"""A key with the read scope: policies, runs, the queue's state."""
Trigger = Annotated[Principal, Depends(_trigger)]
"""A key with cleanup:trigger: open, pause, resume and cancel runs."""
Approver = Annotated[Principal, Depends(_approver)]
"""A key with cleanup:approve: approve a run awaiting approval."""
CronManager = Annotated[Principal, Depends(_cron_manager)]
"""A key with cron:manage: its own cron targets."""
