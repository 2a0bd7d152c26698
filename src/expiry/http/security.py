"""The gates of a request, in the order a request meets them: the bearer key
(checked from the headers alone, before any body is read; requests without a
valid key rate-limited per client address), per-key rate limits, the body
limit (the body read whole, up to the limit, then handed on), and
Idempotency-Key replay. The keys themselves are expiry.keys."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from ..engines import Engine
    from ..keys import Keys


PUBLIC_PATHS = ("/v1/health", "/v1/discovery", "/openapi.json", "/docs")
"""What answers without a key (still rate-limited per address)."""


def bearer(authorization: str) -> str | None:
    """The secret in an ``Authorization: Bearer SECRET`` header, else None."""
    if not authorization.startswith("Bearer "):
        return None
    return authorization.removeprefix("Bearer ").strip()


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per API key: ``rate`` requests a second, bursts of ``burst``."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def wait(self, key: str) -> float:
        """Seconds until ``key`` may go ahead (0: now), without taking a token."""
        now = time.monotonic()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                return 0.0
            tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def take(self, key: str) -> float:
        """0 if the request may go ahead, else seconds until it may."""
        now = time.monotonic()
        with self._lock:
            bucket = self._buckets.setdefault(key, _Bucket(float(self.burst), now))
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= 1:
                bucket.tokens -= 1
                return 0.0
            return (1 - bucket.tokens) / self.rate


def request_hash(method: str, path: str, body: bytes) -> str:
    return hashlib.sha256(method.encode() + b" " + path.encode() + b"\n" + body).hexdigest()


class Idempotency:
    """First response wins for 24 hours; a different body is refused; in flight is 409."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def begin(self, api_key: str, key: str, digest: str) -> tuple[str, int | None, Any]:
        """('new', None, None) | ('replay', status, body) | ('mismatch'|'in_flight', None, None)"""
        engine = self.engine
        with engine.transaction() as conn:
            if engine.idempotency_begin(api_key, key, digest, conn=conn):
                return "new", None, None
            record = engine.idempotency_get(api_key, key, conn=conn)
            if record is None:  # expired: start over
                engine.idempotency_forget(api_key, key, conn=conn)
                engine.idempotency_begin(api_key, key, digest, conn=conn)
                return "new", None, None
        if record.request_hash != digest:
            return "mismatch", None, None
        if record.status is None:
            return "in_flight", None, None
        return "replay", record.status, json.loads(record.body or "null")

    def finish(self, api_key: str, key: str, status: int, body: Any) -> None:
        self.engine.idempotency_finish(api_key, key, status, json.dumps(body, default=str))

    def forget(self, api_key: str, key: str) -> None:
        self.engine.idempotency_forget(api_key, key)


async def send_error(
    send: Send, status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> None:
    """The API's JSON error, sent from a middleware."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class KeyGate:
    """ASGI middleware, before any body is read: a request under /v1 (and
    /metrics when it needs a key) must carry a valid bearer key, else 401;
    a request without a valid key is rate-limited per client address (429),
    and one with a key per key (429, replays of an Idempotency-Key included);
    a dashboard form post, per client address (``forms``). The key found is ``scope["state"]["principal"]``
    for the routes."""

    def __init__(
        self,
        app: ASGIApp,
        keys: Keys,
        per_key: RateLimiter,
        anonymous: RateLimiter,
        *,
        forms: RateLimiter | None = None,
        metrics_key: bool = False,
    ) -> None:
        self.app, self.keys, self.per_key, self.anonymous = app, keys, per_key, anonymous
        self.forms, self.metrics_key = forms, metrics_key

    def _guarded(self, path: str) -> bool:
        if path == "/metrics":
            return self.metrics_key
        return path.startswith("/v1/") and not path.startswith(PUBLIC_PATHS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        dashboard = not (path.startswith("/v1/") or path == "/metrics")
        if dashboard and scope["method"] == "POST" and self.forms is not None:
            # A form post (sign-in, an action) is a person's click: limited per
            # address before its body is read, signed in or not.
            if await self._too_many(self.forms, client_address(scope), send):
                return
        authorization = dict(scope.get("headers") or []).get(b"authorization", b"")
        secret = bearer(authorization.decode("latin-1"))
        principal = await run_in_threadpool(self.keys.resolve, secret) if secret else None
        if principal is None:
            if not dashboard and await self._too_many(self.anonymous, client_address(scope), send):
                return
            if self._guarded(path):
                await send_error(
                    send,
                    401,
                    "unauthorized",
                    "send a valid API key: Authorization: Bearer KEY "
                    "(create one with `expiry keys create NAME`)",
                )
                return
        elif not dashboard and await self._too_many(
            self.per_key, principal.name, send, f" for key {principal.name!r}"
        ):
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    @staticmethod
    async def _too_many(limiter: RateLimiter, who: str, send: Send, named: str = "") -> bool:
        wait = limiter.take(who)
        if wait <= 0:
            return False
        retry = max(1, math.ceil(wait))
        await send_error(
            send,
            429,
            "rate_limited",
            f"too many requests{named}; retry in {retry}s",
            {"Retry-After": str(retry)},
        )
        return True


class BodyLimit:
    """ASGI middleware: 413 for a body over the limit, declared or streamed
    (chunked): the body is read whole, up to the limit, before the app sees
    any of it; every body under /v1 is read as JSON. The dashboard's forms
    have a limit of their own, a few KiB (they are read before any sign-in
    or CSRF check: 4 MiB of fields took 1.8 s of the event loop to parse). A
    body not in ``timeout`` seconds after its head gets 408."""

    def __init__(
        self, app: ASGIApp, limit: int, form_limit: int = 16 * 1024, timeout: float = 30.0
    ) -> None:
        self.app, self.limit, self.form_limit, self.timeout = app, limit, form_limit, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        dashboard = not (scope["path"].startswith("/v1/") or scope["path"] == "/metrics")
        limit = self.form_limit if dashboard else self.limit
        if not dashboard:
            scope = _as_json(scope, headers)
        declared = headers.get(b"content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            await self._refuse(send, limit)
            return
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        try:
            body = await asyncio.wait_for(self._read(receive, limit), self.timeout)
        except TimeoutError:
            await send_error(
                send, 408, "body_timeout", f"the request body took over {self.timeout:g}s"
            )
            return
        if body is None:  # over the limit, or the client left
            await self._refuse(send, limit)
            return
        await self.app(scope, _replay(body, receive), send)

    @staticmethod
    async def _read(receive: Receive, limit: int) -> bytes | None:
        """The whole body, or None past ``limit`` bytes or on a disconnect."""
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    async def _refuse(send: Send, limit: int) -> None:
        await send_error(send, 413, "body_too_large", f"request body is over {limit} bytes")


def _as_json(scope: Scope, headers: dict[bytes, bytes]) -> Scope:
    """The API speaks only JSON: a body sent without (or with curl's default)
    content type is read as JSON rather than refused."""
    if scope["method"] not in ("POST", "PUT", "PATCH") or headers.get(
        b"content-type", b""
    ).startswith(b"application/json"):
        return scope
    rest = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
    return {**scope, "headers": [*rest, (b"content-type", b"application/json")]}


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands on the body read once, then waits for a disconnect."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:  # the body was handed on already: wait for a disconnect
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
