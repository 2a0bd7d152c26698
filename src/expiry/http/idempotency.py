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

from .security import Idempotency, KeyRing, request_hash


class IdempotencyMiddleware:
    def __init__(self, app: ASGIApp, store: Idempotency, keys: KeyRing) -> None:
        self.app, self.store, self.keys = app, store, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        key = headers.get(b"idempotency-key", b"").decode()
        if scope["type"] != "http" or scope["method"] != "POST" or not key:
            await self.app(scope, receive, send)
            return
        auth = headers.get(b"authorization", b"").decode()
        owner = (
            await run_in_threadpool(self.keys.name_for, auth.removeprefix("Bearer ").strip())
            if auth.startswith("Bearer ")
            else None
        )
        if owner is None:  # let the route answer 401
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        state, status, stored = await run_in_threadpool(
            self.store.begin, owner, key, request_hash("POST", scope["path"], body)
        )
        if state == "replay":
            assert status is not None
            await _send_json(send, status, stored, replayed=True)
            return
        if state == "mismatch":
            await _send_json(
                send,
                422,
                {
                    "error": {
                        "code": "idempotency_key_reused",
                        "message": "this Idempotency-Key was used with a different request body",
                    }
                },
            )
            return
        if state == "in_flight":
            await _send_json(
                send,
                409,
                {
                    "error": {
                        "code": "idempotency_in_flight",
                        "message": "a request with this Idempotency-Key is still in progress; retry later",
                    }
                },
            )
            return
        captured: dict[str, Any] = {"status": 500, "body": b""}
        held: list[Message] = []
        body_sent = False

        async def replay_body() -> Message:
            nonlocal body_sent
            if body_sent:  # the body was read already: wait for a disconnect
                return await receive()
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def capture(message: Message) -> None:
            # Held back until the answer is stored: a client that has seen the
            # answer and retries must get the replay, never "still in progress".
            if message["type"] == "http.response.start":
                captured["status"] = message["status"]
            elif message["type"] == "http.response.body":
                captured["body"] += message.get("body", b"")
            held.append(message)

        try:
            await self.app(scope, replay_body, capture)
        except Exception:
            await run_in_threadpool(self.store.forget, owner, key)
            raise
        if captured["status"] >= 500 or captured["status"] in (401, 429):
            await run_in_threadpool(self.store.forget, owner, key)
        else:
            try:
                parsed = json.loads(captured["body"] or b"null")
            except ValueError:
                parsed = None
            await run_in_threadpool(self.store.finish, owner, key, captured["status"], parsed)
        for message in held:
            await send(message)


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
