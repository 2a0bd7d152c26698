"""How the HTTP API answers errors: always ``{"error": {"code", "message"}}``.

    ApiError                   raised by routes and dependencies: status, code, message
    RequestValidationError     422 invalid_request (bad JSON, wrong types, unknown fields)
    HTTPException (Starlette)  404 not_found, 405 method_not_allowed; 400 becomes 422
    PayloadTooLarge            413 message_too_large
    QuotaExceeded              403 quota_exceeded (cron targets: the limit and the fix named);
                               a publish past a key's quotas (quotas.py) is 429 with Retry-After
    ExpiryError                422 cutoff_refused / invalid_request, 409 lease_lost /
                               key_conflict,
                               503 unavailable (TransientError), else 500 internal
    any other exception        500 internal (logged)
    a database that cannot     503 unavailable with Retry-After (DatabaseUnavailable,
      serve now                  the outermost middleware)

BodyLimit (security.py) answers 413 body_too_large and the Idempotency-Key
middleware 409 / 422 with the same body shape.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import (
    ConfigError,
    CutoffRefused,
    ExpiryError,
    KeyConflict,
    LeaseLost,
    PayloadTooLarge,
    QuotaExceeded,
    SchemaError,
    TransientError,
)
from .models import ErrorResponse
from .render import PageRefused

if TYPE_CHECKING:
    from ..engines import Engine

log = logging.getLogger("expiry.http")


class ApiError(Exception):
    """An answer other than success, with its status, stable code and message."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


# -- the error responses the OpenAPI schema documents --------------------------------

COMMON: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorResponse},
    400: {"model": ErrorResponse, "description": "an Idempotency-Key that is not printable ASCII"},
    401: {"model": ErrorResponse},
    403: {"model": ErrorResponse, "description": "the key lacks the scope the route needs"},
    413: {"model": ErrorResponse, "description": "a body over the limit"},
    429: {"model": ErrorResponse, "description": "over the rate limit: wait Retry-After"},
}
"""What any route may answer."""
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse}}
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"model": ErrorResponse}}
TOO_LARGE: dict[int | str, dict[str, Any]] = {413: {"model": ErrorResponse}}
QUOTA: dict[int | str, dict[str, Any]] = {429: {"model": ErrorResponse}}


# -- exception handlers --------------------------------------------------------------


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.code, exc.message, exc.headers)


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(422, "invalid_request", validation_message(exc))


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400:
        # FastAPI's answer to a body its JSON parser gave up on (e.g. nested
        # too deeply): a bad body, so 422 like any other.
        return error_response(
            422, "invalid_request", f"the body could not be read as JSON: {exc.detail}"
        )
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


async def too_large(request: Request, exc: PayloadTooLarge) -> JSONResponse:
    return error_response(413, "message_too_large", str(exc))


async def expiry_error(request: Request, exc: ExpiryError) -> JSONResponse:
    if isinstance(exc, CutoffRefused):
        return error_response(422, "cutoff_refused", str(exc))
    if isinstance(exc, SchemaError):
        # The reason quotes the policy's table, columns and where clause: an
        # operator reads it in `expiry check`, the log and the dashboard, not
        # every API caller.
        log.warning("request refused: %s", exc)
        return error_response(
            422,
            "policy_unusable",
            "the policy does not fit its table now; an operator sees why with `expiry check`",
        )
    if isinstance(exc, ConfigError):
        return error_response(422, "invalid_request", str(exc))
    if isinstance(exc, QuotaExceeded):
        return error_response(403, "quota_exceeded", str(exc))
    if isinstance(exc, LeaseLost):
        return error_response(409, "lease_lost", str(exc))
    if isinstance(exc, KeyConflict):
        return error_response(409, "key_conflict", str(exc))
    if isinstance(exc, TransientError):
        log.warning("request failed, worth a retry: %s", exc)
        return error_response(
            503, "unavailable", "the database could not serve this now; retry", {"Retry-After": "1"}
        )
    # The text may quote SQL or a table: the log has it, the caller a plain answer.
    log.error("request failed: %s %s: %s", request.method, request.url.path, exc)
    return error_response(500, "internal", "the server failed; see its log")


async def page_refused(request: Request, exc: PageRefused) -> Response:
    return exc.response


async def unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("request failed: %s %s", request.method, request.url.path)
    return error_response(500, "internal", "the server failed; see its log")


Handler = Callable[[Request, Any], Awaitable[Response]]
HANDLERS: tuple[tuple[type[Exception], Handler], ...] = (
    (ApiError, api_error),
    (RequestValidationError, invalid_request),
    (StarletteHTTPException, http_error),
    (PayloadTooLarge, too_large),
    (PageRefused, page_refused),
    (ExpiryError, expiry_error),
    (Exception, unexpected),
)


def add_handlers(api: FastAPI) -> None:
    """Answer every error above with its JSON body."""
    for exc_type, handler in HANDLERS:
        api.add_exception_handler(exc_type, handler)


def validation_message(exc: RequestValidationError) -> str:
    """Each problem as ``field: message``, joined by semicolons."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"


# -- a database that cannot serve now ------------------------------------------------

DATABASE_UNAVAILABLE = frozenset(
    {
        "connection_lost",
        "admin_shutdown",
        "crash_shutdown",
        "cannot_connect_now",
        "too_many_connections",
        "read_only",
        "disk_full",
        "out_of_memory",
        "lock_timeout",
        "statement_timeout",
        "deadlock",
        "serialization_failure",
    }
)
"""Error kinds (Engine.classify) that say the database cannot serve a request now."""


class DatabaseUnavailable:
    """The outermost middleware: a database that cannot serve now (down, cut,
    read-only, full, locked) answers 503 with Retry-After, whichever layer met it
    (a route, the idempotency store, the key lookup). The failed statement changed
    nothing, so the client's retry is safe."""

    def __init__(self, app: ASGIApp, engine: Engine) -> None:
        self.app, self.engine = app, engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            transient, kind = self.engine.classify(exc)
            if started or not (transient and kind in DATABASE_UNAVAILABLE):
                raise
            log.warning(
                "request refused, database unavailable (%s): %s %s: %s",
                kind,
                scope["method"],
                scope["path"],
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            response = error_response(
                503,
                "unavailable",
                f"the database is unavailable ({kind}); retry shortly",
                {"Retry-After": "1"},
            )
            await response(scope, receive, send)
