"""The gates of a request: the bearer key's secret, per-key rate limits,
Idempotency-Key replay and the body limit. The keys themselves are
expiry.keys."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from ..engines import Engine


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


class BodyLimit:
    """ASGI middleware: 413 for a body over the limit, declared or streamed; every
    body is read as JSON."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if scope["method"] in ("POST", "PUT", "PATCH") and not headers.get(
            b"content-type", b""
        ).startswith(b"application/json"):
            # The API speaks only JSON: read a body sent without (or with curl's default)
            # content type as JSON rather than refusing it.
            rest = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*rest, (b"content-type", b"application/json")]}
        declared = headers.get(b"content-length")
        if declared and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        seen = 0
        refused = False

        async def counted() -> Message:
            nonlocal seen, refused
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                refused = True
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": "body_too_large",
                    "message": f"request body is over {self.limit} bytes",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
