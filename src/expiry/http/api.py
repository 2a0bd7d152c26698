"""The HTTP API: plain JSON under /v1, bearer keys, errors with stable codes.

Every error body is ``{"error": {"code": ..., "message": ...}}``. Bad JSON,
wrong types and unknown fields get 422; a message over 256 KiB or a body over
the limit gets 413; an unknown key 401; too many requests 429 with
Retry-After. The routes are thin: they validate, call the library, shape the
answer.
"""

import logging
import math
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import status as status_view
from ..cleanup import format_time
from ..errors import (
    ConfigError,
    CutoffRefused,
    ExpiryError,
    LeaseLost,
    PayloadTooLarge,
    SchemaError,
)
from ..queue import new_job
from ..types import Job, JobState
from . import models as m
from .dashboard import dashboard_router
from .discovery import discovery_router
from .idempotency import IdempotencyMiddleware
from .security import BodyLimit, Idempotency, KeyRing, RateLimiter

if TYPE_CHECKING:
    from ..app import App
    from ..engines import Engine

log = logging.getLogger("expiry.http")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


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

    def __init__(self, app: ASGIApp, engine: "Engine") -> None:
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


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"


def receipt(job: Job) -> str:
    return f"{job.id}.{job.attempt}.{job.lease_token}"


def job_from_receipt(text: str) -> Job:
    try:
        job_id, attempt, token = text.split(".", 2)
        return Job(
            id=int(job_id),
            queue="",
            handler="",
            key="",
            payload={},
            state=JobState.RUNNING,
            priority=0,
            attempt=int(attempt),
            max_attempts=0,
            run_at=None,  # type: ignore[arg-type]
            lease_token=token,
        )
    except ValueError:
        raise ApiError(422, "invalid_receipt", "receipt is not one this server issued") from None


def create_app(app: "App") -> FastAPI:
    """The ASGI application for ``expiry serve``."""
    http = app.config.http if app.config else None
    keys = KeyRing(app)
    limiter = RateLimiter(
        http.rate_limit_per_second if http else 50.0, http.rate_limit_burst if http else 100
    )
    api = FastAPI(
        title="expiry",
        version="1",
        description=__doc__,
        responses={
            422: {"model": m.ErrorResponse},
            401: {"model": m.ErrorResponse},
            429: {"model": m.ErrorResponse, "description": "over the rate limit: wait Retry-After"},
        },
    )

    def require_key(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        name = (
            keys.name_for(auth.removeprefix("Bearer ").strip())
            if auth.startswith("Bearer ")
            else None
        )
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
    # Path and query text reaches SQL parameters: constrain it like the bodies.
    CronName = Annotated[str, Path(pattern=m.CRON_NAME)]
    RunId = Annotated[str, Path(max_length=300, pattern=m.NO_NUL)]
    PolicyFilter = Annotated[str | None, Query(max_length=63, pattern=m.NO_NUL)]
    QueueFilter = Annotated[str | None, Query(pattern=m.QUEUE_NAME)]
    v1 = APIRouter(prefix="/v1")

    @api.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    @api.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", _validation_message(exc))

    @api.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # FastAPI's answer to a body its JSON parser gave up on (e.g. nested
            # too deeply): a bad body, so 422 like any other.
            return error_response(
                422, "invalid_request", f"the body could not be read as JSON: {exc.detail}"
            )
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    @api.exception_handler(PayloadTooLarge)
    async def _too_large(request: Request, exc: PayloadTooLarge) -> JSONResponse:
        return error_response(413, "message_too_large", str(exc))

    @api.exception_handler(ExpiryError)
    async def _expiry(request: Request, exc: ExpiryError) -> JSONResponse:
        if isinstance(exc, CutoffRefused):
            return error_response(422, "cutoff_refused", str(exc))
        if isinstance(exc, ConfigError | SchemaError):
            return error_response(422, "invalid_request", str(exc))
        return error_response(
            409 if isinstance(exc, LeaseLost) else 500, type(exc).__name__, str(exc)
        )

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed: %s %s", request.method, request.url.path)
        return error_response(500, "internal", "the server failed; see its log")

    # -- health, metrics ------------------------------------------------------------

    @v1.get("/health", tags=["meta"])
    def health() -> dict[str, Any]:
        return {"ok": True, "database": app.engine.dialect, "now": format_time(app.engine.now())}

    @api.get("/metrics", tags=["meta"], response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        from ..metrics import render

        body, content_type = render(app)
        return PlainTextResponse(body, media_type=content_type)

    # -- queue ----------------------------------------------------------------------

    @v1.post(
        "/queue/publish",
        response_model=m.Published,
        tags=["queue"],
        responses={413: {"model": m.ErrorResponse}},
    )
    def publish(body: m.PublishRequest, _: Key) -> m.Published:
        job = new_job(
            body.queue,
            body.message,
            body.run_at or body.delay_seconds,
            body.key,
            queue=body.queue,
            priority=body.priority,
            max_attempts=body.max_attempts,
        )
        [result] = app.queue.enqueue_many([job])
        return m.Published(key=result.key, queue=body.queue, enqueued=result.enqueued)

    @v1.post(
        "/queue/publish_batch",
        response_model=m.PublishedBatch,
        tags=["queue"],
        responses={413: {"model": m.ErrorResponse}},
    )
    def publish_batch(body: m.PublishBatchRequest, _: Key) -> m.PublishedBatch:
        jobs = [
            new_job(
                body.queue,
                message,
                body.delay_seconds,
                body.keys[i] if body.keys else None,
                queue=body.queue,
            )
            for i, message in enumerate(body.messages)
        ]
        results = app.queue.enqueue_many(jobs)
        shaped = [m.Published(key=r.key, queue=body.queue, enqueued=r.enqueued) for r in results]
        fresh = sum(r.enqueued for r in results)
        return m.PublishedBatch(results=shaped, enqueued=fresh, duplicates=len(results) - fresh)

    @v1.post("/queue/receive", response_model=m.Received, tags=["queue"])
    def receive(body: m.ReceiveRequest, name: Key) -> m.Received:
        jobs = app.queue.claim(
            body.max, body.lease_seconds, queues=(body.queue,), owner=f"http:{name}"
        )
        return m.Received(
            jobs=[
                m.ReceivedJob(
                    receipt=receipt(j),
                    key=j.key,
                    queue=j.queue,
                    message=j.payload,
                    attempt=j.attempt,
                    max_attempts=j.max_attempts,
                    lease_expires_at=j.lease_expires_at,
                )
                for j in jobs
            ]
        )

    @v1.post(
        "/queue/ack",
        response_model=m.JobOutcome,
        tags=["queue"],
        responses={409: {"model": m.ErrorResponse}},
    )
    def ack(body: m.AckRequest, _: Key) -> m.JobOutcome:
        job = job_from_receipt(body.receipt)
        try:
            app.queue.complete(job)
        except LeaseLost:
            raise ApiError(
                409,
                "receipt_expired",
                "the lease behind this receipt expired or moved to "
                "another consumer; the job was not acknowledged",
            ) from None
        return m.JobOutcome(key=str(job.id), state="completed")

    @v1.post(
        "/queue/nack",
        response_model=m.JobOutcome,
        tags=["queue"],
        responses={409: {"model": m.ErrorResponse}},
    )
    def nack(body: m.NackRequest, _: Key) -> m.JobOutcome:
        job = job_from_receipt(body.receipt)
        error = body.error or "nacked by consumer"
        if body.permanent:
            state = app.engine.job_fail(job, error, "nack_permanent", None)
        elif body.delay_seconds is not None:
            state = app.engine.job_fail(job, error, "nack", body.delay_seconds)
        else:
            state = app.queue.fail(job, error, transient=True, kind="nack")
        if state is None:
            raise ApiError(
                409, "receipt_expired", "the lease behind this receipt expired; nothing changed"
            )
        return m.JobOutcome(key=str(job.id), state=state.value)

    @v1.post(
        "/queue/heartbeat",
        response_model=m.JobOutcome,
        tags=["queue"],
        responses={409: {"model": m.ErrorResponse}},
    )
    def heartbeat(body: m.HeartbeatRequest, _: Key) -> m.JobOutcome:
        job = job_from_receipt(body.receipt)
        if not app.queue.heartbeat(job, body.lease_seconds):
            raise ApiError(
                409, "receipt_expired", "the lease behind this receipt expired; stop working on it"
            )
        return m.JobOutcome(key=str(job.id), state="running")

    # -- cron over HTTP ------------------------------------------------------------------

    def _cron_or_404(name: str) -> dict[str, Any]:
        found = app.crons.get(name)
        if found is None:
            raise ApiError(404, "not_found", f"no cron target named {name!r}")
        return found

    @v1.post("/cron/create", response_model=m.CronCreated, status_code=201, tags=["cron"])
    def cron_create(body: m.CronCreateRequest, _: Key) -> m.CronCreated:
        return m.CronCreated(
            **app.crons.create(body.name, body.http_url, body.schedule, body.timezone)
        )

    @v1.get("/cron", response_model=list[m.CronTarget], tags=["cron"])
    def cron_list(_: Key) -> list[m.CronTarget]:
        return [m.CronTarget(**t) for t in app.crons.targets()]

    @v1.get(
        "/cron/{name}",
        response_model=m.CronTarget,
        tags=["cron"],
        responses={404: {"model": m.ErrorResponse}},
    )
    def cron_get(name: CronName, _: Key) -> m.CronTarget:
        return m.CronTarget(**_cron_or_404(name))

    @v1.delete(
        "/cron/{name}",
        response_model=m.Paused,
        tags=["cron"],
        responses={404: {"model": m.ErrorResponse}},
    )
    def cron_delete(name: CronName, _: Key) -> m.Paused:
        found = _cron_or_404(name)
        app.crons.delete(name)
        return m.Paused(name=name, paused=found["paused"])

    @v1.post(
        "/cron/{name}/pause",
        response_model=m.Paused,
        tags=["cron"],
        responses={404: {"model": m.ErrorResponse}},
    )
    def cron_pause(name: CronName, _: Key) -> m.Paused:
        _cron_or_404(name)
        app.crons.set_paused(name, True)
        return m.Paused(name=name, paused=True)

    @v1.post(
        "/cron/{name}/resume",
        response_model=m.Paused,
        tags=["cron"],
        responses={404: {"model": m.ErrorResponse}},
    )
    def cron_resume(name: CronName, _: Key) -> m.Paused:
        _cron_or_404(name)
        app.crons.set_paused(name, False)
        return m.Paused(name=name, paused=False)

    @v1.get(
        "/cron/{name}/calls",
        response_model=list[m.CronCall],
        tags=["cron"],
        responses={404: {"model": m.ErrorResponse}},
    )
    def cron_calls(name: CronName, _: Key) -> list[m.CronCall]:
        _cron_or_404(name)
        return [m.CronCall(**c) for c in app.crons.calls(name)]

    # -- cleanup ----------------------------------------------------------------------

    def _cleanup() -> Any:
        if app.cleanup is None:
            raise ApiError(404, "no_policies", "this server has no config with policies")
        return app.cleanup

    def _known_policy(name: str) -> None:
        try:
            _cleanup().policy(name)
        except ConfigError as exc:
            raise ApiError(404, "not_found", str(exc)) from None

    @v1.post(
        "/cleanup/trigger",
        response_model=m.Triggered,
        tags=["cleanup"],
        responses={404: {"model": m.ErrorResponse}},
    )
    def trigger(body: m.TriggerRequest, name: Key) -> m.Triggered:
        _known_policy(body.policy)
        cleanup = _cleanup()
        if body.dry_run:
            preview = cleanup.preview(body.policy, body.cutoff)
            return m.Triggered(
                policy=body.policy,
                cutoff=format_time(preview.cutoff),
                dry_run=True,
                candidates=preview.candidates,
                windows=preview.windows,
                first_windows=[m.Window(lo=lo, hi=hi) for lo, hi in preview.first_windows],
            )
        opened = cleanup.open_run(
            body.policy, body.cutoff, opened_by="api", actor=f"api:{name}", force=body.force
        )
        return m.Triggered(
            policy=body.policy,
            cutoff=format_time(opened.cutoff),
            dry_run=False,
            run_id=opened.run_id,
            created=opened.created,
        )

    @v1.get("/policies", tags=["cleanup"])
    def policies(_: Key) -> list[dict[str, Any]]:
        return status_view.policies(app)

    def _pause(policy: str, paused: bool, actor: str) -> m.Paused:
        from ..scheduler import Scheduler

        _known_policy(policy)
        Scheduler(app).set_paused(policy, paused, actor=actor)
        return m.Paused(name=policy, paused=paused)

    @v1.post(
        "/policies/{name}/pause",
        response_model=m.Paused,
        tags=["cleanup"],
        responses={404: {"model": m.ErrorResponse}},
    )
    def policy_pause(name: str, key: Key) -> m.Paused:
        return _pause(name, True, f"api:{key}")

    @v1.post(
        "/policies/{name}/resume",
        response_model=m.Paused,
        tags=["cleanup"],
        responses={404: {"model": m.ErrorResponse}},
    )
    def policy_resume(name: str, key: Key) -> m.Paused:
        return _pause(name, False, f"api:{key}")

    @v1.get("/runs", tags=["cleanup"])
    def runs(_: Key, policy: PolicyFilter = None, limit: int = 20) -> list[dict[str, Any]]:
        return status_view.runs(app, policy, max(1, min(limit, 200)))

    @v1.get("/runs/{run_id:path}", tags=["cleanup"], responses={404: {"model": m.ErrorResponse}})
    def run(run_id: RunId, _: Key) -> dict[str, Any]:
        found = status_view.run_summary(app, run_id)
        if found is None:
            raise ApiError(404, "not_found", f"no run {run_id!r}")
        return found

    @v1.get("/dlq", response_model=list[m.DeadJob], tags=["dlq"])
    def dlq(_: Key, queue: QueueFilter = None, limit: int = 100) -> list[m.DeadJob]:
        return [
            m.DeadJob(
                key=j.key,
                queue=j.queue,
                handler=j.handler,
                attempt=j.attempt,
                error=j.last_error,
                kind=j.last_error_kind,
                payload=j.payload,
                errors=j.errors,
            )
            for j in app.queue.dead(queue, max(1, min(limit, 1000)))
        ]

    @v1.post("/dlq/redrive", response_model=m.Keys, tags=["dlq"])
    def redrive(body: m.RedriveRequest, name: Key) -> m.Keys:
        return m.Keys(
            keys=app.queue.redrive(body.keys, all=body.all, policy=body.policy, actor=f"api:{name}")
        )

    @v1.post("/dlq/discard", response_model=m.Keys, tags=["dlq"])
    def discard(body: m.DiscardRequest, name: Key) -> m.Keys:
        return m.Keys(keys=app.queue.discard(body.keys, actor=f"api:{name}"))

    api.include_router(v1)
    api.include_router(discovery_router(api, require_key))
    api.include_router(dashboard_router(app, keys))
    api.add_middleware(IdempotencyMiddleware, store=Idempotency(app), keys=keys)
    api.add_middleware(BodyLimit, limit=http.max_body_bytes if http else 16 * 1024 * 1024)
    api.add_middleware(DatabaseUnavailable, engine=app.engine)
    return api
