"""Idempotency-Key on POST, as ASGI middleware: the first response (status and
body) is stored and replayed for 24 hours to the same key with the same body.

The store is the database, reached through blocking drivers: every call to it
runs in the thread pool, never on the event loop, so a request waiting for a
lock (SQLite's single writer) does not stall the other requests."""

from __future__ import annotations

import json
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .security import Idempotency, request_hash, send_error

REFUSALS = {
    "mismatch": (
        422,
        "idempotency_key_reused",
        "this Idempotency-Key was used with a different request body",
    ),
    "in_flight": (
        409,
        "idempotency_in_flight",
        "a request with this Idempotency-Key is still in progress; retry later",
    ),
}
"""What the store's refusals answer: status, code, message."""


MAX_KEY = 200
"""The longest Idempotency-Key: printable ASCII, as HTTP header values are."""


class IdempotencyMiddleware:
    def __init__(self, app: ASGIApp, store: Idempotency) -> None:
        self.app, self.store = app, store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        raw = headers.get(b"idempotency-key", b"")
        if scope["type"] != "http" or scope["method"] != "POST" or not raw:
            await self.app(scope, receive, send)
            return
        principal = scope.get("state", {}).get("principal")
        if principal is None:  # not an API call with a key: the gate or route answers
            await self.app(scope, receive, send)
            return
        if len(raw) > MAX_KEY or not all(0x21 <= b <= 0x7E for b in raw):
            await send_error(
                send,
                400,
                "invalid_idempotency_key",
                f"Idempotency-Key must be 1 to {MAX_KEY} printable ASCII characters "
                "(a UUID is a good one)",
            )
            return
        key, owner = raw.decode("ascii"), principal.name
        body = await _read_body(receive)
        state, status, stored = await run_in_threadpool(
            self.store.begin, owner, key, request_hash("POST", scope["path"], body)
        )
        if state == "replay":
            assert status is not None
            await _send_json(send, status, stored, replayed=True)
        elif state in REFUSALS:
            status, code, message = REFUSALS[state]
            await _send_json(send, status, {"error": {"code": code, "message": message}})
        else:
            await self._answer_and_store(scope, _Exchange(body, receive), send, (owner, key))

    async def _answer_and_store(
        self, scope: Scope, exchange: _Exchange, send: Send, record: tuple[str, str]
    ) -> None:
        """Run the request, store its answer under ``record`` (owner, key) or
        forget the key when the answer must not be replayed, then send it."""
        try:
            await self.app(scope, exchange.replay_body, exchange.capture)
        except Exception:
            await run_in_threadpool(self.store.forget, *record)
            raise
        if exchange.status >= 500 or exchange.status in (401, 429):
            await run_in_threadpool(self.store.forget, *record)
        else:
            await run_in_threadpool(self.store.finish, *record, exchange.status, exchange.json())
        for message in exchange.held:
            await send(message)


class _Exchange:
    """One request through the app: its body (already read) replayed to the app,
    and the app's answer captured and held back."""

    def __init__(self, body: bytes, receive: Receive) -> None:
        self.body, self.receive = body, receive
        self.body_sent = False
        self.status = 500
        self.answer = b""
        self.held: list[Message] = []

    async def replay_body(self) -> Message:
        if self.body_sent:  # the body was read already: wait for a disconnect
            return await self.receive()
        self.body_sent = True
        return {"type": "http.request", "body": self.body, "more_body": False}

    async def capture(self, message: Message) -> None:
        # Held back until the answer is stored: a client that has seen the
        # answer and retries must get the replay, never "still in progress".
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.answer += message.get("body", b"")
        self.held.append(message)

    def json(self) -> Any:
        """The answer's body as JSON; None when it is not JSON."""
        try:
            return json.loads(self.answer or b"null")
        except ValueError:
            return None


async def _read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        chunk: bytes = message.get("body", b"")
        body += chunk
        if not message.get("more_body"):
            return body


async def _send_json(send: Send, status: int, body: Any, *, replayed: bool = False) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    if replayed:
        headers.append((b"idempotent-replayed", b"true"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
